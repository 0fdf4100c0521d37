# Inputs of the coadapt GCP deployment. `coadapt deploy gcp` checks the variables it is given
# against this file (names, and which ones have no default) before terraform runs.

variable "project" {
  type        = string
  description = "GCP project id everything is created in (controller, nodes, bucket, secrets)."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.project))
    error_message = "project must be a GCP project id: 6-30 characters of lowercase letters, digits and '-', starting with a letter."
  }
}

variable "region" {
  type        = string
  description = "GCP region (e.g. us-central1): the subnetwork, Cloud NAT and the checkpoint bucket live here; every zone in `zones` must belong to it."

  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]+$", var.region))
    error_message = "region must be a GCP region name such as us-central1."
  }
}

variable "zones" {
  type        = list(string)
  description = "Zones of `region` the controller may launch GPU nodes in (at least one; pick zones that have the GPUs you want). The controller VM goes in the first."

  validation {
    condition     = length(var.zones) >= 1
    error_message = "zones must name at least one zone (e.g. [\"us-central1-a\", \"us-central1-b\"])."
  }

  validation {
    condition     = alltrue([for z in var.zones : can(regex("^[a-z]+-[a-z]+[0-9]+-[a-z]$", z))])
    error_message = "every zone must be a GCE zone name such as us-central1-a."
  }

  validation {
    condition     = length(distinct(var.zones)) == length(var.zones)
    error_message = "zones must not repeat a zone."
  }
}

variable "cluster_id" {
  type        = string
  description = "The cluster's id: 1-40 characters of lowercase letters, digits and '-', starting with a letter or digit. Names every resource and labels every node."

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{0,39}$", var.cluster_id))
    error_message = "cluster_id must be 1-40 characters of lowercase letters, digits and '-', starting with a letter or digit."
  }
}

variable "network" {
  type        = string
  description = "Existing VPC network (name or self link) to use. null (default): the module creates a network and one subnetwork with Private Google Access, plus Cloud NAT."
  default     = null
}

variable "subnetwork" {
  type        = string
  description = "Existing subnetwork (name or self link, in `region`) of `network`. Required when `network` is set; must be null otherwise."
  default     = null
}

variable "subnet_cidr" {
  type        = string
  description = "Primary IPv4 range of the subnetwork the module creates (ignored with an existing `network`)."
  default     = "10.42.0.0/20"

  validation {
    condition     = can(cidrhost(var.subnet_cidr, 0))
    error_message = "subnet_cidr must be an IPv4 CIDR block such as 10.42.0.0/20."
  }
}

variable "controller_machine_type" {
  type        = string
  description = "Machine type of the controller VM (it runs no training: a small shape is enough)."
  default     = "e2-small"
}

variable "controller_image" {
  type        = string
  description = "Boot image of the controller VM (a Debian-like image with python3; the startup script installs python3-venv with apt)."
  default     = "projects/debian-cloud/global/images/family/debian-12"
}

variable "controller_port" {
  type        = number
  description = "TCP port of the controller's API (agents and users connect to it)."
  default     = 8080

  validation {
    condition     = var.controller_port >= 1024 && var.controller_port <= 65535 && floor(var.controller_port) == var.controller_port
    error_message = "controller_port must be an integer within 1024-65535."
  }
}

variable "controller_external_ip" {
  type        = bool
  description = "Give the controller VM an ephemeral external IP. false (default): private address only; with a module-made network Cloud NAT gives it outbound access (pip)."
  default     = false
}

variable "api_allowed_cidrs" {
  type        = list(string)
  description = "Source ranges allowed to reach the controller's API port (users' CLIs, a VPN range). [] (default): only the nodes reach it. 0.0.0.0/0 is refused."
  default     = []

  validation {
    condition     = alltrue([for c in var.api_allowed_cidrs : can(cidrhost(c, 0)) && !contains(["0.0.0.0/0", "::/0"], c)])
    error_message = "api_allowed_cidrs must be CIDR blocks, and not 0.0.0.0/0 or ::/0 (the API must not be open to the internet)."
  }
}

variable "ssh_allowed_cidrs" {
  type        = list(string)
  description = "Source ranges allowed to SSH (port 22) to the controller and the nodes. [] (default): no SSH. Use 35.235.240.0/20 for IAP TCP forwarding. 0.0.0.0/0 is refused."
  default     = []

  validation {
    condition     = alltrue([for c in var.ssh_allowed_cidrs : can(cidrhost(c, 0)) && !contains(["0.0.0.0/0", "::/0"], c)])
    error_message = "ssh_allowed_cidrs must be CIDR blocks, and not 0.0.0.0/0 or ::/0."
  }
}

variable "node_image" {
  type        = string
  description = "Boot image of the GPU nodes the controller creates: one with NVIDIA drivers, python3 and pip (e.g. a Deep Learning VM image family such as projects/deeplearning-platform-release/global/images/family/common-cu123-debian-11-py310)."

  validation {
    condition     = length(trimspace(var.node_image)) > 0
    error_message = "node_image is required: a GPU image with NVIDIA drivers, python3 and pip."
  }
}

variable "max_instances" {
  type        = number
  description = "Fleet size cap: the most GPU nodes the controller keeps at once (`coadapt up --max-instances`)."
  default     = 8

  validation {
    condition     = var.max_instances >= 1 && floor(var.max_instances) == var.max_instances
    error_message = "max_instances must be an integer >= 1."
  }
}

variable "coadapt_pip_spec" {
  type        = string
  description = "What the controller and the nodes `pip install` (a package name with an optional version, a wheel URL, or a VCS URL)."
  default     = "coadapt"

  validation {
    condition     = length(trimspace(var.coadapt_pip_spec)) > 0
    error_message = "coadapt_pip_spec must not be empty."
  }
}

variable "checkpoint_retention_days" {
  type        = number
  description = "Days a noncurrent (overwritten or deleted) checkpoint object version is kept in the bucket before it is deleted."
  default     = 30

  validation {
    condition     = var.checkpoint_retention_days >= 1 && floor(var.checkpoint_retention_days) == var.checkpoint_retention_days
    error_message = "checkpoint_retention_days must be an integer >= 1."
  }
}

variable "labels" {
  type        = map(string)
  description = "Extra labels on every labelled resource the module creates (not on the nodes: the controller labels those)."
  default     = {}
}

variable "team_store" {
  type        = bool
  description = "Keep the controllers' store in Cloud SQL for PostgreSQL 15 (private IP only, TLS required, backups with point-in-time recovery, regional availability and deletion protection by default; its user's password generated into Secret Manager, read by the controllers at start) and run controller_count controllers behind an internal TCP load balancer at controller_url. false (default): one controller with its SQLite file on its boot disk."
  default     = false
}

variable "controller_count" {
  type        = number
  description = "How many controllers run `coadapt up` (one leads, the others stand by); controller i runs in zones[i mod the number of zones]. null (default): 2 with team_store, else 1. More than 1 needs team_store."
  default     = null

  validation {
    condition     = var.controller_count == null || (try(floor(var.controller_count) == var.controller_count, false) && try(var.controller_count >= 1 && var.controller_count <= 3, false))
    error_message = "controller_count must be 1, 2 or 3 (or null)."
  }
}

variable "store_tier" {
  type        = string
  description = "Cloud SQL machine tier of the team store (with team_store), e.g. db-custom-1-3840 (1 vCPU, 3.75 GB)."
  default     = "db-custom-1-3840"

  validation {
    condition     = can(regex("^db-", var.store_tier))
    error_message = "store_tier must be a Cloud SQL tier such as db-custom-1-3840."
  }
}

variable "store_disk_size_gb" {
  type        = number
  description = "The team store's SSD, GB (with team_store; at least 10); Cloud SQL grows it when it fills."
  default     = 10

  validation {
    condition     = var.store_disk_size_gb >= 10 && floor(var.store_disk_size_gb) == var.store_disk_size_gb
    error_message = "store_disk_size_gb must be an integer >= 10."
  }
}

variable "store_backup_retention_days" {
  type        = number
  description = "How many daily automated backups of the team store Cloud SQL keeps (with team_store): 1-365 (backups stay on); point-in-time recovery covers the last min(7, this) days."
  default     = 7

  validation {
    condition     = var.store_backup_retention_days >= 1 && var.store_backup_retention_days <= 365 && floor(var.store_backup_retention_days) == var.store_backup_retention_days
    error_message = "store_backup_retention_days must be an integer within 1-365 (backups stay on)."
  }
}

variable "store_high_availability" {
  type        = bool
  description = "A standby of the team store in a second zone of the region (Cloud SQL REGIONAL availability; with team_store). false: ZONAL, and the database is the pair's one point of failure."
  default     = true
}

variable "store_deletion_protection" {
  type        = bool
  description = "Refuse to delete the team store's Cloud SQL instance, in terraform and in the Cloud SQL API (with team_store). Set it to false (and apply) before a destroy that should delete the database."
  default     = true
}
