data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

locals {
  prefix     = "coadapt-${var.cluster_id}"
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition
  # Not the ownership tags the controller puts on the GPU nodes it launches (coadapt-cluster-id
  # with coadapt-managed-by = coadapt): what terraform makes is never taken for a node.
  tags = merge(var.tags, {
    "coadapt-deployment" = var.cluster_id
    "coadapt-managed-by" = "terraform"
  })

  # The API's one address: the load balancer's with team_store, else the one controller's.
  controller_host = var.team_store ? aws_lb.api[0].dns_name : aws_network_interface.controller[0].private_ip
  controller_url  = "http://${local.controller_host}:${var.controller_port}"

  # Each node's own agent credential is an SSM parameter under this path, made by the
  # controller (autoscaler/controller/cloud_setup.py, AwsAgentCredentials).
  agent_credential_path = "/coadapt/${var.cluster_id}/agents"
  user_token_parameter  = "/coadapt/${var.cluster_id}/user-token"
  checkpoint_root       = "s3://${aws_s3_bucket.checkpoints.bucket}/checkpoints"

  # What the controller reads (`coadapt up --provider aws --provider-config`): the keys of
  # autoscaler/controller/cloud_setup.py.
  provider_config = {
    kind                   = "aws"
    region                 = var.region
    launch_template_id     = aws_launch_template.nodes.id
    subnets_by_zone        = local.subnets_by_zone
    security_group_ids     = [aws_security_group.node.id]
    instance_types         = var.node_instance_types
    interruption_queue_url = aws_sqs_queue.interruptions.url
    checkpoint_root        = local.checkpoint_root
    agent_credential_path  = local.agent_credential_path
    instance_arn_prefix    = "${local.ec2_arn}:instance/"
    user_token_parameter   = local.user_token_parameter
    job_storage_role_arn   = aws_iam_role.job_storage.arn
  }
}
