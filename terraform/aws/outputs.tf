output "cluster_id" {
  description = "The cluster's id (the coadapt-cluster-id tag on every node)."
  value       = var.cluster_id
}

output "region" {
  description = "The cluster's region."
  value       = var.region
}

output "controller_url" {
  description = "The controller API's URL: the internal load balancer's with team_store, else the controller's (a private address: reach it from the VPC, a VPN in api_allowed_cidrs, or a tunnel)."
  value       = local.controller_url
}

output "controller_instance_id" {
  description = "The first controller's EC2 instance id (SSM Session Manager, logs)."
  value       = aws_instance.controller[0].id
}

output "controller_instance_ids" {
  description = "Every controller's EC2 instance id (one leads; `coadapt status` says which)."
  value       = aws_instance.controller[*].id
}

output "store_endpoint" {
  description = "The team store's address (host:port of the RDS instance; null without team_store). No credential: the password is in the secret store_secret_arn, readable by the controllers' role."
  value       = var.team_store ? "${aws_db_instance.store[0].address}:${aws_db_instance.store[0].port}" : null
}

output "store_secret_arn" {
  description = "The Secrets Manager secret RDS keeps the team store's master credential in (null without team_store); the controllers' role alone is granted to read it."
  value       = local.team_store ? local.store.secret_arn : null
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
