# Offline plans of the module: fake credentials come from the environment
# (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, any value), data sources are overridden.
provider "aws" {
  region                      = "us-east-1"
  skip_credentials_validation = true
  skip_requesting_account_id  = true
  skip_metadata_api_check     = true
  skip_region_validation      = true
}

variables {
  region      = "us-east-1"
  cluster_id  = "team-a"
  node_ami_id = "ami-0123456789abcdef0"
}

override_data {
  override_during = plan
  target          = data.aws_caller_identity.current
  values          = { account_id = "123456789012" }
}
override_data {
  override_during = plan
  target          = data.aws_partition.current
  values          = { partition = "aws" }
}
override_data {
  override_during = plan
  target          = data.aws_availability_zones.available
  values          = { names = ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"] }
}
override_data {
  override_during = plan
  target          = data.aws_ssm_parameter.al2023
  values          = { value = "ami-0aaaaaaaaaaaaaaaa" }
}
override_data {
  override_during = plan
  target          = data.aws_subnet.chosen[0]
  values          = { id = "subnet-00", availability_zone = "us-east-1a" }
}
override_data {
  override_during = plan
  target          = data.aws_subnet.chosen[1]
  values          = { id = "subnet-01", availability_zone = "us-east-1b" }
}
override_data {
  override_during = plan
  target          = data.aws_subnet.chosen[2]
  values          = { id = "subnet-02", availability_zone = "us-east-1c" }
}

override_resource {
  override_during = plan
  target          = aws_iam_role.node
  values          = { arn = "arn:aws:iam::123456789012:role/coadapt-team-a-node-x", name = "coadapt-team-a-node-x" }
}
override_resource {
  override_during = plan
  target          = aws_iam_role.job_storage
  values          = { arn = "arn:aws:iam::123456789012:role/coadapt-team-a-jobs-x", name = "coadapt-team-a-jobs-x" }
}
override_resource {
  override_during = plan
  target          = aws_sqs_queue.interruptions
  values          = { arn = "arn:aws:sqs:us-east-1:123456789012:coadapt-team-a-interruptions", url = "https://sqs.us-east-1.amazonaws.com/123456789012/coadapt-team-a-interruptions", id = "https://sqs.us-east-1.amazonaws.com/123456789012/coadapt-team-a-interruptions" }
}
override_resource {
  override_during = plan
  target          = aws_ssm_parameter.user_token
  values          = { arn = "arn:aws:ssm:us-east-1:123456789012:parameter/coadapt/team-a/user-token" }
}
override_resource {
  override_during = plan
  target          = aws_launch_template.nodes
  values          = { id = "lt-0123456789abcdef0" }
}
override_resource {
  override_during = plan
  target          = aws_security_group.node
  values          = { id = "sg-0node", arn = "arn:aws:ec2:us-east-1:123456789012:security-group/sg-0node" }
}
override_resource {
  override_during = plan
  target          = aws_s3_bucket.checkpoints
  values          = { id = "coadapt-team-a-abc", bucket = "coadapt-team-a-abc", arn = "arn:aws:s3:::coadapt-team-a-abc" }
}
override_resource {
  override_during = plan
  target          = aws_network_interface.controller
  values          = { id = "eni-0abc", private_ip = "10.40.0.10" }
}
override_resource {
  override_during = plan
  target          = aws_cloudwatch_event_rule.interruptions
  values          = { arn = "arn:aws:events:us-east-1:123456789012:rule/coadapt-team-a-interruptions" }
}
override_resource {
  override_during = plan
  target          = aws_subnet.private
  values          = { id = "subnet-0abc" }
}

run "plan_with_a_new_vpc" {
  command = plan
  assert {
    condition     = length(output.provider_config.subnets_by_zone) == 3
    error_message = "subnets_by_zone"
  }
}

run "existing_vpc_without_subnets_is_refused" {
  command = plan
  variables {
    vpc_id = "vpc-0abc"
  }
  expect_failures = [aws_network_interface.controller]

}

run "open_api_is_refused" {
  command = plan
  variables {
    api_allowed_cidrs = ["0.0.0.0/0"]
  }
  expect_failures = [var.api_allowed_cidrs]
}

run "two_subnets_in_one_zone_are_refused" {
  command = plan
  variables {
    vpc_id     = "vpc-0abc"
    subnet_ids = ["subnet-0", "subnet-1", "subnet-x"]
  }
  expect_failures = [aws_network_interface.controller]
  override_data {
    override_during = plan
    target          = data.aws_subnet.chosen[2]
    values          = { id = "subnet-x", availability_zone = "us-east-1a" }
  }

}

run "existing_vpc_three_zones" {
  command = plan
  variables {
    vpc_id     = "vpc-0abc"
    subnet_ids = ["subnet-0", "subnet-1", "subnet-2"]
  }
  assert {
    condition     = output.provider_config.subnets_by_zone == { "us-east-1a" = "subnet-0", "us-east-1b" = "subnet-1", "us-east-1c" = "subnet-2" }
    error_message = "subnets_by_zone"
  }
}

run "bad_pip_spec_is_refused" {
  command = plan
  variables {
    coadapt_pip_spec = "coadapt'; rm -rf /"
  }
  expect_failures = [var.coadapt_pip_spec]
}

run "bad_cluster_id_is_refused" {
  command = plan
  variables {
    cluster_id = "Team_A"
  }
  expect_failures = [var.cluster_id]
}

run "bad_kms_is_refused" {
  command = plan
  variables {
    kms_key_arn = "alias/foo"
  }
  expect_failures = [var.kms_key_arn]
}

run "with_a_kms_key" {
  command = plan
  variables {
    kms_key_arn = "arn:aws:kms:us-east-1:123456789012:key/11111111-2222-3333-4444-555555555555"
  }
}

run "team_store_plans_a_private_database_and_a_controller_pair" {
  command = plan
  variables {
    team_store = true
  }
  override_resource {
    override_during = plan
    target          = aws_db_instance.store
    values = {
      address            = "coadapt-team-a-store.abc.us-east-1.rds.amazonaws.com"
      port               = 5432
      master_user_secret = [{ secret_arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:rds!db-abc", kms_key_id = "", secret_status = "active" }]
    }
  }
  override_resource {
    override_during = plan
    target          = aws_lb.api
    values          = { arn = "arn:aws:elasticloadbalancing:us-east-1:123456789012:loadbalancer/net/cdapt-x/abc", dns_name = "cdapt-x.elb.us-east-1.amazonaws.com" }
  }
  override_resource {
    override_during = plan
    target          = aws_lb_target_group.api
    values          = { arn = "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/cdapt-x/abc" }
  }
  override_resource {
    override_during = plan
    target          = aws_security_group.store
    values          = { id = "sg-0store" }
  }
  assert {
    condition     = length(aws_instance.controller) == 2 && length(aws_lb_target_group_attachment.api) == 2
    error_message = "two controllers behind the balancer"
  }
  assert {
    condition     = output.controller_url == "http://cdapt-x.elb.us-east-1.amazonaws.com:8080"
    error_message = "the agents and users are given the balancer's address"
  }
  assert {
    condition     = aws_db_instance.store[0].publicly_accessible == false && aws_db_instance.store[0].storage_encrypted && aws_db_instance.store[0].deletion_protection && aws_db_instance.store[0].backup_retention_period > 0
    error_message = "the store: private, encrypted, protected, backed up"
  }
  assert {
    condition     = output.store_secret_arn == "arn:aws:secretsmanager:us-east-1:123456789012:secret:rds!db-abc" && output.store_endpoint == "coadapt-team-a-store.abc.us-east-1.rds.amazonaws.com:5432"
    error_message = "the store's secret and address are output (no password)"
  }
}

run "a_pair_without_the_team_store_is_refused" {
  command = plan
  variables {
    controller_count = 2
  }
  expect_failures = [aws_instance.controller]
}
