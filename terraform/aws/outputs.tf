output "cluster_id" {
  description = "The cluster's id (the coadapt-cluster-id tag on every node)."
  value       = var.cluster_id
}

output "region" {
  description = "The cluster's region."
  value       = var.region
}

output "controller_url" {
  description = "The controller API's URL (a private address: reach it from the VPC, a VPN in api_allowed_cidrs, or a tunnel)."
  value       = local.controller_url
}

output "controller_instance_id" {
  description = "The controller's EC2 instance id (SSM Session Manager, logs)."
  value       = aws_instance.controller.id
}

output "checkpoint_bucket" {
  description = "The checkpoint bucket's name (jobs without their own location checkpoint under s3://<bucket>/checkpoints/)."
  value       = aws_s3_bucket.checkpoints.bucket
}

output "interruption_queue_url" {
  description = "The SQS queue EC2's interruption events reach."
  value       = aws_sqs_queue.interruptions.url
}

output "launch_template_id" {
  description = "The GPU nodes' launch template."
  value       = aws_launch_template.nodes.id
}

output "agent_credential_path" {
  description = "The SSM path under which the controller keeps each node's own agent credential (<path>/<instance key>, a SecureString tagged with the node's instance ARN; only that node may read it)."
  value       = local.agent_credential_path
}

output "user_token_parameter" {
  description = "The SSM SecureString parameter holding the users' token (the coadapt CLI reads it)."
  value       = aws_ssm_parameter.user_token.name
}

output "node_security_group_id" {
  description = "The GPU nodes' security group."
  value       = aws_security_group.node.id
}

output "provider_config" {
  description = "The controller's provider config (/etc/coadapt/provider.json on the controller)."
  value       = local.provider_config
}
