# The GPU nodes' launch template and the users' token parameter.
#
# The controller launches from this template with EC2 Fleet or RunInstances, choosing the
# instance type, the subnet and the market per request and tagging each instance with the
# cluster id and the launch's request id. EC2 Fleet cannot vary user data per request, so the
# template's user data is the same on every node and carries no secret: a node reads its own
# request id from its tags (instance metadata tags), hence its instance key, and its own agent
# credential from the SSM parameter <agent_credential_path>/<instance key>, which the
# controller writes once the cloud lists the instance, tagged with the instance's ARN. The
# nodes' role may read such a parameter only when that tag is the calling instance's own ARN
# (iam.tf), so no node reads another's.

# The users' token is made by `coadapt up` at the controller's first boot and written here
# (ssm:PutParameter); terraform only creates the parameter, with a placeholder, so no token
# passes through its state. The nodes' credential parameters are the controller's alone
# (made and deleted by it, never by terraform).
resource "aws_ssm_parameter" "user_token" {
  #checkov:skip=CKV_AWS_337:The AWS-managed key (aws/ssm) encrypts it: the controller needs no KMS permission beyond its declared list, and the value never passes through terraform.
  name        = local.user_token_parameter
  description = "coadapt ${var.cluster_id}: the users' API token (written by the controller at boot; read by the coadapt CLI)"
  type        = "SecureString"
  value       = "placeholder: coadapt up has not started yet"
  tags        = local.tags

  lifecycle {
    ignore_changes = [value]
  }
}

# The controller's address is fixed before the template needs it (without team_store; with it,
# the agents are given the load balancer's): its network interface is
# made first (the subnet picks the address), the template's user data reads its private_ip, and
# the controller instance attaches it. The instance's own user data embeds the template's id, so
# taking the address from aws_instance.controller instead would be a cycle
# (instance -> template -> instance).
resource "aws_network_interface" "controller" {
  count           = local.controller_count
  subnet_id       = try(local.subnet_ids[count.index % length(local.subnet_ids)], null)
  security_groups = [aws_security_group.controller.id]
  description     = "coadapt ${var.cluster_id}: controller ${count.index}'s address (the agents' API URL without team_store)"
  tags            = merge(local.tags, { Name = "${local.prefix}-controller-${count.index}" })

  lifecycle {
    precondition {
      condition     = local.create_vpc || length(var.subnet_ids) > 0
      error_message = "With vpc_id, give subnet_ids (the first holds the controller)."
    }
    precondition {
      condition     = length(local.subnet_ids_by_zone) == length(local.subnet_ids)
      error_message = "subnet_ids: one subnet per availability zone (the controller maps each zone to one subnet)."
    }
  }
}

resource "aws_launch_template" "nodes" {
  #checkov:skip=CKV_AWS_341:A hop limit of 2 lets containers on a node (a training image run with docker) reach IMDSv2; tokens stay required.
  name_prefix            = "${local.prefix}-nodes-"
  description            = "coadapt ${var.cluster_id}: GPU nodes (the controller picks type, subnet and market)"
  image_id               = var.node_ami_id
  ebs_optimized          = true
  update_default_version = true
  vpc_security_group_ids = [aws_security_group.node.id]

  iam_instance_profile {
    arn = aws_iam_instance_profile.node.arn
  }

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 2
    instance_metadata_tags      = "enabled"
  }

  block_device_mappings {
    device_name = var.node_root_device_name
    ebs {
      volume_size           = var.node_root_volume_gb
      volume_type           = "gp3"
      encrypted             = true
      kms_key_id            = var.kms_key_arn
      delete_on_termination = true
    }
  }

  monitoring {
    enabled = true
  }

  user_data = base64encode(templatefile("${path.module}/templates/node-user-data.sh.tftpl", {
    region          = var.region
    cluster_id      = var.cluster_id
    api_url         = local.controller_url
    credential_path = local.agent_credential_path
    checkpoint_root = local.checkpoint_root
    job_role_arn    = aws_iam_role.job_storage.arn
    pip_spec        = var.coadapt_pip_spec
  }))

  tags = local.tags
}
