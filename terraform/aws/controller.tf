# The controllers: controller_count small on-demand instances (one without team_store), each
# running `coadapt up --provider aws` as a systemd service with the deployment's provider config;
# with team_store each reads the store's URL at start (team_store.tf) and one leads.

data "aws_ssm_parameter" "al2023" {
  count = var.controller_ami_id == null ? 1 : 0
  name  = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
}

resource "aws_instance" "controller" {
  count                       = local.controller_count
  ami                         = var.controller_ami_id != null ? var.controller_ami_id : nonsensitive(data.aws_ssm_parameter.al2023[0].value)
  instance_type               = var.controller_instance_type
  iam_instance_profile        = aws_iam_instance_profile.controller.name
  ebs_optimized               = true
  monitoring                  = true
  disable_api_termination     = false # coadapt destroy / terraform destroy remove it
  user_data_replace_on_change = false

  network_interface {
    network_interface_id = aws_network_interface.controller[count.index].id
    device_index         = 0
  }

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  root_block_device {
    volume_size = 20
    volume_type = "gp3"
    encrypted   = true
    kms_key_id  = var.kms_key_arn
  }

  user_data = templatefile("${path.module}/templates/controller-user-data.sh.tftpl", {
    pip_spec      = var.controller_pip_spec
    provider_json = jsonencode(local.provider_config)
    cluster_id    = var.cluster_id
    port          = var.controller_port
    max_instances = var.max_instances
    region        = var.region
    store         = local.store
  })

  tags = merge(local.tags, { Name = "${local.prefix}-controller-${count.index}" })

  lifecycle {
    # A new image must not replace the controller (its store holds the fleet's state).
    ignore_changes = [ami]
    precondition {
      condition     = local.controller_count == 1 || var.team_store
      error_message = "controller_count above 1 needs team_store = true (controllers share only a PostgreSQL store)."
    }
  }
}
