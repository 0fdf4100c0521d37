variable "cluster_id" {
  type        = string
  description = "The cluster's id: the GPU nodes carry it as coadapt-cluster-id, terraform's resources as coadapt-deployment; 1-40 characters of lowercase letters, digits and '-', starting with a letter or digit."

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{0,39}$", var.cluster_id))
    error_message = "cluster_id: 1-40 characters of [a-z0-9-], starting with a letter or digit."
  }
}

variable "region" {
  type        = string
  description = "The AWS region of the cluster (the example's provider uses it; the module writes it into the controller's provider config)."
}

variable "vpc_id" {
  type        = string
  default     = null
  description = "An existing VPC to use (with subnet_ids). Null: the module creates a small VPC: private subnets for the controller and the nodes, one NAT gateway for their outbound traffic, an S3 gateway endpoint."
}

variable "subnet_ids" {
  type        = list(string)
  default     = []
  description = "Subnets of vpc_id for the controller (the first) and the GPU nodes (all; one per zone the nodes may use). Required with vpc_id; their route to the internet (pip, AWS APIs) is yours."
}

variable "vpc_cidr" {
  type        = string
  default     = "10.40.0.0/16"
  description = "The CIDR of the VPC the module creates (when vpc_id is null)."
}

variable "availability_zones" {
  type        = list(string)
  default     = []
  description = "Zones of the subnets the module creates (when vpc_id is null); empty: the region's first three available zones."
}

variable "controller_instance_type" {
  type        = string
  default     = "t3.small"
  description = "Instance type of each controller (on-demand; it runs the API, the rounds and, without team_store, a SQLite store)."
}

variable "controller_ami_id" {
  type        = string
  default     = null
  description = "The controller's AMI; null: the latest Amazon Linux 2023 (x86_64) from the public SSM parameter."
}

variable "controller_port" {
  type        = number
  default     = 8080
  description = "TCP port of the controller's API (agents and users)."
}

variable "api_allowed_cidrs" {
  type        = list(string)
  default     = []
  description = "Networks (a VPN, a bastion) allowed to reach the controller API besides the nodes; none by default. Never 0.0.0.0/0."

  validation {
    condition     = !contains(var.api_allowed_cidrs, "0.0.0.0/0") && !contains(var.api_allowed_cidrs, "::/0")
    error_message = "api_allowed_cidrs must not open the API to the whole internet."
  }
}

variable "ssh_allowed_cidrs" {
  type        = list(string)
  default     = []
  description = "Networks allowed SSH (port 22) to the controller and the nodes; none by default (use SSM Session Manager). Never 0.0.0.0/0."

  validation {
    condition     = !contains(var.ssh_allowed_cidrs, "0.0.0.0/0") && !contains(var.ssh_allowed_cidrs, "::/0")
    error_message = "ssh_allowed_cidrs must not open SSH to the whole internet."
  }
}

variable "node_ami_id" {
  type        = string
  description = "The GPU nodes' AMI: NVIDIA drivers, python3 (3.11+) with venv and pip, and the AWS CLI (a Deep Learning AMI, for example)."
}

variable "node_root_device_name" {
  type        = string
  default     = "/dev/sda1"
  description = "The root device name of node_ami_id (/dev/sda1 on Ubuntu-based AMIs, /dev/xvda on Amazon Linux)."
}

variable "node_root_volume_gb" {
  type        = number
  default     = 200
  description = "Size of each node's encrypted gp3 root volume, GiB."
}

variable "node_instance_types" {
  type        = list(string)
  default     = ["g4dn.xlarge", "g4dn.12xlarge", "p3.2xlarge", "p3.8xlarge", "g5.xlarge", "p4d.24xlarge"]
  description = "The GPU instance types the controller may launch (names or wildcards such as g5.*); it picks a mix by goodput per dollar."
}

variable "max_instances" {
  type        = number
  default     = 8
  description = "Most GPU nodes the controller holds at once."
}

variable "coadapt_pip_spec" {
  type        = string
  default     = "coadapt[aws,trainer]"
  description = "The pip requirement the nodes install (the agent and the trainer): a version such as 'coadapt[aws,trainer]==0.1.0', or a wheel URL (an S3 presigned URL, for example) such as 'coadapt[aws,trainer] @ https://...whl'."

  validation {
    condition     = length(trimspace(var.coadapt_pip_spec)) > 0 && !can(regex("['\\n]", var.coadapt_pip_spec))
    error_message = "coadapt_pip_spec: a non-empty pip requirement without single quotes or newlines (it is quoted in the nodes' user data)."
  }
}

variable "controller_pip_spec" {
  type        = string
  default     = "coadapt[aws]"
  description = "The pip requirement the controller installs (like coadapt_pip_spec: a version or a wheel URL, with the aws extra)."

  validation {
    condition     = length(trimspace(var.controller_pip_spec)) > 0 && !can(regex("['\\n]", var.controller_pip_spec))
    error_message = "controller_pip_spec: a non-empty pip requirement without single quotes or newlines (it is quoted in the controller's user data)."
  }
}

variable "checkpoint_retention_days" {
  type        = number
  default     = 30
  description = "Days an overwritten or deleted checkpoint version is kept in the bucket."
}

variable "kms_key_arn" {
  type        = string
  default     = null
  description = "A customer-managed KMS key for the checkpoint bucket (SSE-KMS) and the EBS root volumes; null: SSE-S3 and the aws/ebs key. Its key policy must let the controller role and the EC2 Spot service-linked role use it for EBS (README)."

  validation {
    condition     = var.kms_key_arn == null || can(regex("^arn:aws[a-z-]*:kms:", var.kms_key_arn))
    error_message = "kms_key_arn: a KMS key ARN (arn:aws:kms:...), or null."
  }
}

variable "tags" {
  type        = map(string)
  default     = {}
  description = "Extra tags on every resource the module creates."
}

variable "team_store" {
  type        = bool
  default     = false
  description = "Keep the controllers' store in RDS for PostgreSQL (encrypted, private, Multi-AZ, deletion protection and backups on; its master password generated by RDS into Secrets Manager, read by the controllers at start) and run controller_count controllers behind an internal network load balancer. False: one controller with its SQLite file on its root volume."
}

variable "controller_count" {
  type        = number
  default     = null
  description = "How many controllers run `coadapt up` (one leads, the others stand by); null: 2 with team_store, else 1. More than 1 needs team_store."

  validation {
    condition     = var.controller_count == null || (try(floor(var.controller_count) == var.controller_count, false) && try(var.controller_count >= 1 && var.controller_count <= 3, false))
    error_message = "controller_count: 1, 2 or 3 (or null)."
  }
}

variable "store_instance_class" {
  type        = string
  default     = "db.t4g.small"
  description = "The RDS instance class of the team store (with team_store)."
}

variable "store_allocated_storage_gb" {
  type        = number
  default     = 20
  description = "The team store's encrypted gp3 storage, GiB (with team_store); RDS grows it up to 5 times this."
}

variable "store_backup_retention_days" {
  type        = number
  default     = 7
  description = "Days RDS keeps the team store's automated backups (with team_store); 1-35."

  validation {
    condition     = var.store_backup_retention_days >= 1 && var.store_backup_retention_days <= 35
    error_message = "store_backup_retention_days: 1 to 35 (backups stay on)."
  }
}

variable "store_multi_az" {
  type        = bool
  default     = true
  description = "A standby of the team store in a second zone (with team_store): without it, the database is the pair's one point of failure."
}
