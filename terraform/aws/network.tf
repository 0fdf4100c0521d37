# The network: an existing VPC and subnets (vpc_id, subnet_ids), or a small VPC made here with
# private subnets, one NAT gateway and an S3 gateway endpoint (README: why not public subnets). Two security groups: the
# controller's API port is open to the nodes (and api_allowed_cidrs); the nodes talk to each
# other on every TCP port (distributed training). Nothing admits 0.0.0.0/0.

data "aws_availability_zones" "available" {
  #checkov:skip=CKV_AWS_394:Read only to choose the zones of a VPC the module creates when availability_zones is empty; the subnets are fixed at creation (set availability_zones to pin them).
  state = "available"
  filter {
    name   = "zone-type"
    values = ["availability-zone"]
  }
}

locals {
  create_vpc = var.vpc_id == null
  zones = (
    length(var.availability_zones) > 0
    ? var.availability_zones
    : slice(data.aws_availability_zones.available.names, 0, min(3, length(data.aws_availability_zones.available.names)))
  )
  vpc_id     = local.create_vpc ? aws_vpc.coadapt[0].id : var.vpc_id
  subnet_ids = local.create_vpc ? aws_subnet.private[*].id : var.subnet_ids
  # The controller's provider config maps each zone to its subnet (one subnet per zone: the
  # controller network interface's precondition says so when subnet_ids has two in one zone).
  subnet_ids_by_zone = { for s in data.aws_subnet.chosen : s.availability_zone => s.id... }
  subnets_by_zone    = { for zone, ids in local.subnet_ids_by_zone : zone => ids[0] }
}

data "aws_subnet" "chosen" {
  count = length(local.subnet_ids)
  id    = local.subnet_ids[count.index]
}

resource "aws_vpc" "coadapt" {
  #checkov:skip=CKV2_AWS_11:Flow logs belong to the account's logging baseline (a log bucket or group and its retention); the module makes no log destination of its own.
  count                = local.create_vpc ? 1 : 0
  cidr_block           = var.vpc_cidr
  enable_dns_support   = true
  enable_dns_hostnames = true
  tags                 = merge(local.tags, { Name = local.prefix })
}

# The VPC's default security group admits nothing (CKV2_AWS_12).
resource "aws_default_security_group" "coadapt" {
  count  = local.create_vpc ? 1 : 0
  vpc_id = aws_vpc.coadapt[0].id
  tags   = merge(local.tags, { Name = "${local.prefix}-default-closed" })
}

resource "aws_subnet" "private" {
  count                   = local.create_vpc ? length(local.zones) : 0
  vpc_id                  = aws_vpc.coadapt[0].id
  availability_zone       = local.zones[count.index]
  cidr_block              = cidrsubnet(var.vpc_cidr, 4, count.index)
  map_public_ip_on_launch = false
  tags                    = merge(local.tags, { Name = "${local.prefix}-private-${local.zones[count.index]}" })
}

# One small public subnet holds the NAT gateway (nothing else runs there).
resource "aws_subnet" "public" {
  count                   = local.create_vpc ? 1 : 0
  vpc_id                  = aws_vpc.coadapt[0].id
  availability_zone       = local.zones[0]
  cidr_block              = cidrsubnet(var.vpc_cidr, 8, 255)
  map_public_ip_on_launch = false
  tags                    = merge(local.tags, { Name = "${local.prefix}-nat" })
}

resource "aws_internet_gateway" "coadapt" {
  count  = local.create_vpc ? 1 : 0
  vpc_id = aws_vpc.coadapt[0].id
  tags   = merge(local.tags, { Name = local.prefix })
}

resource "aws_eip" "nat" {
  count  = local.create_vpc ? 1 : 0
  domain = "vpc"
  tags   = merge(local.tags, { Name = "${local.prefix}-nat" })
}

resource "aws_nat_gateway" "coadapt" {
  count         = local.create_vpc ? 1 : 0
  allocation_id = aws_eip.nat[0].id
  subnet_id     = aws_subnet.public[0].id
  tags          = merge(local.tags, { Name = local.prefix })
  depends_on    = [aws_internet_gateway.coadapt]
}

resource "aws_route_table" "public" {
  count  = local.create_vpc ? 1 : 0
  vpc_id = aws_vpc.coadapt[0].id
  route {
    cidr_block = "0.0.0.0/0"
    gateway_id = aws_internet_gateway.coadapt[0].id
  }
  tags = merge(local.tags, { Name = "${local.prefix}-public" })
}

resource "aws_route_table_association" "public" {
  count          = local.create_vpc ? 1 : 0
  subnet_id      = aws_subnet.public[0].id
  route_table_id = aws_route_table.public[0].id
}

resource "aws_route_table" "private" {
  count  = local.create_vpc ? 1 : 0
  vpc_id = aws_vpc.coadapt[0].id
  route {
    cidr_block     = "0.0.0.0/0"
    nat_gateway_id = aws_nat_gateway.coadapt[0].id
  }
  tags = merge(local.tags, { Name = "${local.prefix}-private" })
}

resource "aws_route_table_association" "private" {
  count          = local.create_vpc ? length(local.zones) : 0
  subnet_id      = aws_subnet.private[count.index].id
  route_table_id = aws_route_table.private[0].id
}

# Checkpoints go to S3 without crossing the NAT gateway.
resource "aws_vpc_endpoint" "s3" {
  count             = local.create_vpc ? 1 : 0
  vpc_id            = aws_vpc.coadapt[0].id
  service_name      = "com.amazonaws.${var.region}.s3"
  vpc_endpoint_type = "Gateway"
  route_table_ids   = [aws_route_table.private[0].id]
  tags              = merge(local.tags, { Name = "${local.prefix}-s3" })
}

resource "aws_security_group" "controller" {
  name_prefix = "${local.prefix}-controller-"
  description = "coadapt ${var.cluster_id}: the controller (API port from the nodes and api_allowed_cidrs)"
  vpc_id      = local.vpc_id
  tags        = merge(local.tags, { Name = "${local.prefix}-controller" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_security_group" "node" {
  name_prefix = "${local.prefix}-node-"
  description = "coadapt ${var.cluster_id}: GPU nodes (every TCP port from each other)"
  vpc_id      = local.vpc_id
  tags        = merge(local.tags, { Name = "${local.prefix}-node" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "controller_api_from_nodes" {
  security_group_id            = aws_security_group.controller.id
  description                  = "coadapt agents and trainers report to the controller API"
  referenced_security_group_id = aws_security_group.node.id
  ip_protocol                  = "tcp"
  from_port                    = var.controller_port
  to_port                      = var.controller_port
}

resource "aws_vpc_security_group_ingress_rule" "controller_api_from_users" {
  for_each          = toset(var.api_allowed_cidrs)
  security_group_id = aws_security_group.controller.id
  description       = "coadapt users' CLI (api_allowed_cidrs) to the controller API"
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = var.controller_port
  to_port           = var.controller_port
}

resource "aws_vpc_security_group_ingress_rule" "nodes_from_nodes" {
  #checkov:skip=CKV_AWS_24:The source is the node security group itself (referenced_security_group_id), not 0.0.0.0/0: only the cluster's own nodes reach these ports.
  #checkov:skip=CKV_AWS_25:The source is the node security group itself, not 0.0.0.0/0.
  #checkov:skip=CKV_AWS_260:The source is the node security group itself, not 0.0.0.0/0.
  security_group_id            = aws_security_group.node.id
  description                  = "distributed training between the cluster's nodes (rendezvous, gloo/NCCL)"
  referenced_security_group_id = aws_security_group.node.id
  ip_protocol                  = "tcp"
  from_port                    = 0
  to_port                      = 65535
}

resource "aws_vpc_security_group_ingress_rule" "ssh" {
  for_each = {
    for pair in setproduct(["controller", "node"], var.ssh_allowed_cidrs) :
    "${pair[0]}-${pair[1]}" => { group = pair[0], cidr = pair[1] }
  }
  security_group_id = each.value.group == "controller" ? aws_security_group.controller.id : aws_security_group.node.id
  description       = "SSH from ssh_allowed_cidrs"
  cidr_ipv4         = each.value.cidr
  ip_protocol       = "tcp"
  from_port         = 22
  to_port           = 22
}

# Outbound: HTTPS only (pip, the AWS APIs, Amazon Linux's dnf repositories, which are served
# over HTTPS), plus the cluster's own ports below. Nothing in the user data needs plain HTTP.
resource "aws_vpc_security_group_egress_rule" "https" {
  for_each          = { controller = aws_security_group.controller.id, node = aws_security_group.node.id }
  security_group_id = each.value
  description       = "HTTPS out: pip and the AWS APIs (EC2, SQS, SSM, S3)"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
}

resource "aws_vpc_security_group_egress_rule" "nodes_to_nodes" {
  security_group_id            = aws_security_group.node.id
  description                  = "distributed training between the cluster's nodes"
  referenced_security_group_id = aws_security_group.node.id
  ip_protocol                  = "tcp"
  from_port                    = 0
  to_port                      = 65535
}

resource "aws_vpc_security_group_egress_rule" "nodes_to_controller" {
  security_group_id            = aws_security_group.node.id
  description                  = "agents and trainers to the controller API"
  referenced_security_group_id = aws_security_group.controller.id
  ip_protocol                  = "tcp"
  from_port                    = var.controller_port
  to_port                      = var.controller_port
}
