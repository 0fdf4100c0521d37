# The team's control plane (team_store = true): the store in RDS for PostgreSQL and
# controller_count controllers behind an internal network load balancer. Every controller
# serves the API; one leads (a lease in the database). The agents and the users are given the
# balancer's address.
#
# The database: private (no public address, in the cluster's subnets), reachable on 5432 from
# the controllers' security group alone, encrypted at rest (kms_key_arn, else the aws/rds key),
# TLS required, Multi-AZ, deletion protection and automated backups on, a final snapshot on
# destroy. Its master password is made by RDS itself (manage_master_user_password) and kept in
# Secrets Manager: it never passes through terraform (no state, no plan, no output, no user
# data). Each controller reads it at start (templates/controller-user-data.sh.tftpl: a root
# ExecStartPre writes COADAPT_STORE_URL into a 0600 environment file under /run), with the one
# grant of iam.tf's controller_store policy: secretsmanager:GetSecretValue on that secret.

locals {
  team_store       = var.team_store
  controller_count = coalesce(var.controller_count, var.team_store ? 2 : 1)
  store_port       = 5432
  store_database   = "coadapt"
  store_user       = "coadapt"
  # What a controller needs to build the store URL, none of it secret.
  store = local.team_store ? {
    host       = aws_db_instance.store[0].address
    port       = local.store_port
    database   = local.store_database
    secret_arn = aws_db_instance.store[0].master_user_secret[0].secret_arn
  } : null
}

resource "aws_db_subnet_group" "store" {
  count       = local.team_store ? 1 : 0
  name_prefix = "${local.prefix}-store-"
  description = "coadapt ${var.cluster_id}: the team store's private subnets"
  subnet_ids  = local.subnet_ids
  tags        = local.tags

  lifecycle {
    precondition {
      condition     = length(local.subnet_ids_by_zone) >= 2
      error_message = "team_store needs subnets in at least two availability zones (RDS)."
    }
  }
}

resource "aws_security_group" "store" {
  count       = local.team_store ? 1 : 0
  name_prefix = "${local.prefix}-store-"
  description = "coadapt ${var.cluster_id}: the team store (PostgreSQL from the controllers only)"
  vpc_id      = local.vpc_id
  tags        = merge(local.tags, { Name = "${local.prefix}-store" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "store_from_controllers" {
  count                        = local.team_store ? 1 : 0
  security_group_id            = aws_security_group.store[0].id
  description                  = "PostgreSQL from the coadapt controllers"
  referenced_security_group_id = aws_security_group.controller.id
  ip_protocol                  = "tcp"
  from_port                    = local.store_port
  to_port                      = local.store_port
}

resource "aws_vpc_security_group_egress_rule" "controllers_to_store" {
  count                        = local.team_store ? 1 : 0
  security_group_id            = aws_security_group.controller.id
  description                  = "the controllers to their PostgreSQL store"
  referenced_security_group_id = aws_security_group.store[0].id
  ip_protocol                  = "tcp"
  from_port                    = local.store_port
  to_port                      = local.store_port
}

# TLS only (rds.force_ssl), and each connection and lock wait logged.
resource "aws_db_parameter_group" "store" {
  count       = local.team_store ? 1 : 0
  name_prefix = "${local.prefix}-store-"
  family      = "postgres16"
  description = "coadapt ${var.cluster_id}: the team store (TLS only)"
  tags        = local.tags

  parameter {
    name  = "rds.force_ssl"
    value = "1"
  }
  parameter {
    name  = "log_connections"
    value = "1"
  }
  parameter {
    name  = "log_lock_waits"
    value = "1"
  }

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_db_instance" "store" {
  #checkov:skip=CKV_AWS_118:Enhanced monitoring needs a monitoring role of its own; CloudWatch's standard RDS metrics and the exported PostgreSQL log cover the store.
  #checkov:skip=CKV_AWS_161:The controllers authenticate with the master password RDS keeps in Secrets Manager (coadapt's store takes a libpq URL); IAM tokens expire every 15 minutes and the store has no hook to renew them.
  #checkov:skip=CKV_AWS_353:Performance Insights is not available on every small instance class the store runs on; enable it with the console where the class allows.
  #checkov:skip=CKV_AWS_354:Performance Insights is off (CKV_AWS_353), so it has no key.
  #checkov:skip=CKV2_AWS_30:Statement logging would write every round's queries (one per second) to CloudWatch; connections and lock waits are logged (the parameter group).
  count                               = local.team_store ? 1 : 0
  identifier_prefix                   = "${substr(local.prefix, 0, 40)}-store-"
  engine                              = "postgres"
  engine_version                      = "16"
  instance_class                      = var.store_instance_class
  allocated_storage                   = var.store_allocated_storage_gb
  max_allocated_storage               = var.store_allocated_storage_gb * 5
  storage_type                        = "gp3"
  storage_encrypted                   = true
  kms_key_id                          = var.kms_key_arn
  db_name                             = local.store_database
  username                            = local.store_user
  manage_master_user_password         = true
  master_user_secret_kms_key_id       = var.kms_key_arn
  port                                = local.store_port
  db_subnet_group_name                = aws_db_subnet_group.store[0].name
  vpc_security_group_ids              = [aws_security_group.store[0].id]
  parameter_group_name                = aws_db_parameter_group.store[0].name
  publicly_accessible                 = false
  multi_az                            = var.store_multi_az
  deletion_protection                 = true
  backup_retention_period             = var.store_backup_retention_days
  copy_tags_to_snapshot               = true
  skip_final_snapshot                 = false
  final_snapshot_identifier           = "${local.prefix}-store-final"
  auto_minor_version_upgrade          = true
  enabled_cloudwatch_logs_exports     = ["postgresql"]
  iam_database_authentication_enabled = false
  apply_immediately                   = false
  tags                                = merge(local.tags, { Name = "${local.prefix}-store" })
}

# The balancer: internal, in the cluster's subnets, TCP on the API port to every controller,
# health-checked over TCP (the API has no unauthenticated health endpoint). Its own security
# group admits what the controllers' admits (the nodes, api_allowed_cidrs) and sends only to
# the controllers.
resource "aws_security_group" "api" {
  count       = local.team_store ? 1 : 0
  name_prefix = "${local.prefix}-api-"
  description = "coadapt ${var.cluster_id}: the API's load balancer (API port from the nodes and api_allowed_cidrs)"
  vpc_id      = local.vpc_id
  tags        = merge(local.tags, { Name = "${local.prefix}-api" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "api_from_nodes" {
  count                        = local.team_store ? 1 : 0
  security_group_id            = aws_security_group.api[0].id
  description                  = "coadapt agents and trainers to the API's load balancer"
  referenced_security_group_id = aws_security_group.node.id
  ip_protocol                  = "tcp"
  from_port                    = var.controller_port
  to_port                      = var.controller_port
}

resource "aws_vpc_security_group_ingress_rule" "api_from_users" {
  for_each          = local.team_store ? toset(var.api_allowed_cidrs) : toset([])
  security_group_id = aws_security_group.api[0].id
  description       = "coadapt users' CLI (api_allowed_cidrs) to the API's load balancer"
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = var.controller_port
  to_port           = var.controller_port
}

resource "aws_vpc_security_group_egress_rule" "api_to_controllers" {
  count                        = local.team_store ? 1 : 0
  security_group_id            = aws_security_group.api[0].id
  description                  = "the load balancer to the controllers' API (requests and health checks)"
  referenced_security_group_id = aws_security_group.controller.id
  ip_protocol                  = "tcp"
  from_port                    = var.controller_port
  to_port                      = var.controller_port
}

resource "aws_vpc_security_group_ingress_rule" "controller_api_from_balancer" {
  count                        = local.team_store ? 1 : 0
  security_group_id            = aws_security_group.controller.id
  description                  = "the API's load balancer (requests and health checks) to the controllers"
  referenced_security_group_id = aws_security_group.api[0].id
  ip_protocol                  = "tcp"
  from_port                    = var.controller_port
  to_port                      = var.controller_port
}

resource "aws_vpc_security_group_egress_rule" "nodes_to_balancer" {
  count                        = local.team_store ? 1 : 0
  security_group_id            = aws_security_group.node.id
  description                  = "agents and trainers to the API's load balancer"
  referenced_security_group_id = aws_security_group.api[0].id
  ip_protocol                  = "tcp"
  from_port                    = var.controller_port
  to_port                      = var.controller_port
}

resource "aws_lb" "api" {
  #checkov:skip=CKV_AWS_91:Access logs need a log bucket of the account's logging baseline; the controllers log every API request.
  #checkov:skip=CKV_AWS_150:Deletion protection would stop terraform destroy (and coadapt destroy); the balancer holds no state and is made again in a minute.
  #checkov:skip=CKV2_AWS_28:A WAF fronts HTTP(S) application load balancers; this is an internal TCP network load balancer.
  count                            = local.team_store ? 1 : 0
  name_prefix                      = "cdapt-"
  internal                         = true
  load_balancer_type               = "network"
  subnets                          = local.subnet_ids
  security_groups                  = [aws_security_group.api[0].id]
  enable_cross_zone_load_balancing = true
  drop_invalid_header_fields       = true
  tags                             = merge(local.tags, { Name = "${local.prefix}-api" })
}

resource "aws_lb_target_group" "api" {
  count                = local.team_store ? 1 : 0
  name_prefix          = "cdapt-"
  port                 = var.controller_port
  protocol             = "TCP"
  target_type          = "instance"
  vpc_id               = local.vpc_id
  deregistration_delay = 30
  tags                 = local.tags

  health_check {
    protocol            = "TCP"
    port                = "traffic-port"
    interval            = 10
    healthy_threshold   = 2
    unhealthy_threshold = 2
  }

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_lb_listener" "api" {
  #checkov:skip=CKV_AWS_2:TCP passthrough on a private balancer: the API speaks HTTP inside the VPC like the single controller it replaces (api_allowed_cidrs: a VPN).
  #checkov:skip=CKV_AWS_103:TCP passthrough, no TLS listener (CKV_AWS_2).
  count             = local.team_store ? 1 : 0
  load_balancer_arn = aws_lb.api[0].arn
  port              = var.controller_port
  protocol          = "TCP"
  tags              = local.tags

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.api[0].arn
  }
}

resource "aws_lb_target_group_attachment" "api" {
  count            = local.team_store ? local.controller_count : 0
  target_group_arn = aws_lb_target_group.api[0].arn
  target_id        = aws_instance.controller[count.index].id
  port             = var.controller_port
}
