# Two roles with the least they need.
# * controller: exactly the calls the AWS adapter is tested to make (providers/aws/permissions.py:
#   controller_iam_actions(); tests/terraform checks this policy against that list), scoped to
#   the cluster's tag, its launch template, subnets, node role, queue, the users' token
#   parameter and the nodes' credential parameters;
# * node: its own credential parameter (tag-conditioned on the calling instance's ARN), and
#   assuming job_storage;
# * job_storage: objects under checkpoints/ in the bucket, assumable by the node role only. A
#   node's agent assumes it for each job with a session policy that narrows it to that job's
#   own prefix (autoscaler/controller/job_storage.py): jobs cannot reach instance metadata
#   (the agent firewalls them off it), so the node role's credentials are the agent's alone.

locals {
  ec2_arn       = "arn:${local.partition}:ec2:${var.region}:${local.account_id}"
  cluster_tag   = "coadapt-cluster-id"
  ssm_arn       = "arn:${local.partition}:ssm:${var.region}:${local.account_id}"
  agents_arn    = "${local.ssm_arn}:parameter${local.agent_credential_path}"
  instance_tag  = "coadapt-instance-arn"
  launch_kinds  = ["RunInstances", "CreateFleet"]
  subnet_arns   = [for id in local.subnet_ids : "${local.ec2_arn}:subnet/${id}"]
  template_arns = ["${local.ec2_arn}:launch-template/${aws_launch_template.nodes.id}"]
}

data "aws_iam_policy_document" "assume_ec2" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

data "aws_iam_policy_document" "controller" {
  # Describe calls cannot be scoped to resources.
  statement {
    sid = "Read"
    actions = [
      "ec2:DescribeAvailabilityZones",
      "ec2:DescribeInstanceTypeOfferings",
      "ec2:DescribeInstanceTypes",
      "ec2:DescribeInstances",
      "ec2:DescribeLaunchTemplates",
      "ec2:DescribeSpotPriceHistory",
    ]
    resources = ["*"]
  }

  # The instances a launch creates must carry the cluster's tag (tag-on-create).
  statement {
    sid       = "LaunchTaggedInstances"
    actions   = ["ec2:RunInstances", "ec2:CreateFleet"]
    resources = ["${local.ec2_arn}:instance/*"]
    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/${local.cluster_tag}"
      values   = [var.cluster_id]
    }
  }

  # So must the (instant) fleet a CreateFleet makes: the adapter tags it with the cluster id.
  statement {
    sid       = "TaggedFleets"
    actions   = ["ec2:CreateFleet"]
    resources = ["${local.ec2_arn}:fleet/*"]
    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/${local.cluster_tag}"
      values   = [var.cluster_id]
    }
  }

  # What else a launch touches, none of which carries the cluster's tag at authorisation time:
  # the deployment's template, subnets, node security group and image (by ARN), and the
  # volumes, network interfaces and spot requests it creates (a fleet's volumes are untagged,
  # spot requests are never tagged, so requiring aws:RequestTag on them would refuse every
  # launch).
  statement {
    sid     = "LaunchFromTheTemplate"
    actions = ["ec2:RunInstances", "ec2:CreateFleet"]
    resources = concat(local.template_arns, local.subnet_arns, [
      aws_security_group.node.arn,
      "arn:${local.partition}:ec2:${var.region}::image/${var.node_ami_id}",
      "${local.ec2_arn}:volume/*",
      "${local.ec2_arn}:network-interface/*",
      "${local.ec2_arn}:spot-instances-request/*",
    ])
  }

  # Tags only as part of a launch.
  statement {
    sid     = "TagOnCreate"
    actions = ["ec2:CreateTags"]
    resources = [
      "${local.ec2_arn}:instance/*",
      "${local.ec2_arn}:volume/*",
      "${local.ec2_arn}:network-interface/*",
      "${local.ec2_arn}:spot-instances-request/*",
      "${local.ec2_arn}:fleet/*",
    ]
    condition {
      test     = "StringEquals"
      variable = "ec2:CreateAction"
      values   = local.launch_kinds
    }
  }

  # Terminate only the nodes the controller launched for this cluster (never the controller:
  # terraform's resources carry other tags).
  statement {
    sid       = "TerminateOwn"
    actions   = ["ec2:TerminateInstances"]
    resources = ["${local.ec2_arn}:instance/*"]
    condition {
      test     = "StringEquals"
      variable = "ec2:ResourceTag/${local.cluster_tag}"
      values   = [var.cluster_id]
    }
    condition {
      test     = "StringEquals"
      variable = "ec2:ResourceTag/coadapt-managed-by"
      values   = ["coadapt"]
    }
  }

  statement {
    sid       = "PassTheNodeRole"
    actions   = ["iam:PassRole"]
    resources = [aws_iam_role.node.arn]
    condition {
      test     = "StringEquals"
      variable = "iam:PassedToService"
      values   = ["ec2.amazonaws.com"]
    }
  }

  # The first spot request of an account creates the EC2 Spot service-linked role.
  statement {
    sid       = "SpotServiceLinkedRole"
    actions   = ["iam:CreateServiceLinkedRole"]
    resources = ["arn:${local.partition}:iam::${local.account_id}:role/aws-service-role/spot.amazonaws.com/*"]
    condition {
      test     = "StringEquals"
      variable = "iam:AWSServiceName"
      values   = ["spot.amazonaws.com"]
    }
  }

  statement {
    sid       = "InterruptionQueue"
    actions   = ["sqs:ReceiveMessage", "sqs:DeleteMessageBatch"]
    resources = [aws_sqs_queue.interruptions.arn]
  }

  # coadapt up publishes the users' token it makes at boot (and after a rotation).
  statement {
    sid       = "PublishUserToken"
    actions   = ["ssm:PutParameter"]
    resources = [aws_ssm_parameter.user_token.arn]
  }

  # Each node's own credential: made (tagged with the node's instance ARN as it is created, or
  # re-tagged when it is written again), and deleted once the node is gone.
  statement {
    sid       = "NodeCredentials"
    actions   = ["ssm:PutParameter", "ssm:DeleteParameter"]
    resources = ["${local.agents_arn}/*"]
  }

  statement {
    sid       = "TagNodeCredentials"
    actions   = ["ssm:AddTagsToResource"]
    resources = ["${local.agents_arn}/*"]
    condition {
      test     = "ForAllValues:StringEquals"
      variable = "aws:TagKeys"
      values   = [local.instance_tag]
    }
  }

  # At start: the credentials of nodes that ended while no controller ran (names only).
  statement {
    sid       = "ListNodeCredentials"
    actions   = ["ssm:GetParametersByPath"]
    resources = [local.agents_arn, "${local.agents_arn}/*"]
  }
}

resource "aws_iam_role" "controller" {
  name_prefix        = "${substr(local.prefix, 0, 24)}-ctl-"
  description        = "coadapt ${var.cluster_id}: the controller (launches and terminates the GPU nodes)"
  assume_role_policy = data.aws_iam_policy_document.assume_ec2.json
  tags               = local.tags
}

resource "aws_iam_role_policy" "controller" {
  name   = "coadapt-controller"
  role   = aws_iam_role.controller.id
  policy = data.aws_iam_policy_document.controller.json
}

resource "aws_iam_instance_profile" "controller" {
  name_prefix = "${substr(local.prefix, 0, 24)}-ctl-"
  role        = aws_iam_role.controller.name
  tags        = local.tags
}

data "aws_iam_policy_document" "node" {
  # The agent hands each job a credential for its own checkpoints (a session of this role).
  statement {
    sid       = "JobStorage"
    actions   = ["sts:AssumeRole"]
    resources = [aws_iam_role.job_storage.arn]
  }

  # A node reads its own credential and no other's: the parameter's tag must be the ARN of
  # the instance making the call (present only for instance-profile credentials).
  statement {
    sid       = "OwnCredential"
    actions   = ["ssm:GetParameter"]
    resources = ["${local.agents_arn}/*"]
    condition {
      test     = "StringEquals"
      variable = "ssm:resourceTag/${local.instance_tag}"
      values   = ["$${ec2:SourceInstanceARN}"]
    }
    condition {
      test     = "Null"
      variable = "ec2:SourceInstanceARN"
      values   = ["false"]
    }
  }

  dynamic "statement" {
    for_each = var.kms_key_arn == null ? [] : [var.kms_key_arn]
    content {
      sid       = "Key"
      actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
      resources = [statement.value]
    }
  }
}

resource "aws_iam_role" "node" {
  name_prefix        = "${substr(local.prefix, 0, 24)}-node-"
  description        = "coadapt ${var.cluster_id}: GPU nodes (each its own agent credential; checkpoints through the job-storage role)"
  assume_role_policy = data.aws_iam_policy_document.assume_ec2.json
  tags               = local.tags
}

resource "aws_iam_role_policy" "node" {
  name   = "coadapt-node"
  role   = aws_iam_role.node.id
  policy = data.aws_iam_policy_document.node.json
}

resource "aws_iam_instance_profile" "node" {
  name_prefix = "${substr(local.prefix, 0, 24)}-node-"
  role        = aws_iam_role.node.name
  tags        = local.tags
}

data "aws_iam_policy_document" "assume_from_nodes" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "AWS"
      identifiers = [aws_iam_role.node.arn]
    }
  }
}

data "aws_iam_policy_document" "job_storage" {
  statement {
    sid       = "Checkpoints"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]
    resources = ["${aws_s3_bucket.checkpoints.arn}/checkpoints/*"]
  }

  statement {
    sid       = "ListCheckpoints"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.checkpoints.arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["checkpoints/*"]
    }
  }

  dynamic "statement" {
    for_each = var.kms_key_arn == null ? [] : [var.kms_key_arn]
    content {
      sid       = "Key"
      actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
      resources = [statement.value]
    }
  }
}

resource "aws_iam_role" "job_storage" {
  name_prefix          = "${substr(local.prefix, 0, 24)}-jobs-"
  description          = "coadapt ${var.cluster_id}: jobs' checkpoints (each job's session narrowed to its own prefix)"
  assume_role_policy   = data.aws_iam_policy_document.assume_from_nodes.json
  max_session_duration = 3600
  tags                 = local.tags
}

resource "aws_iam_role_policy" "job_storage" {
  name   = "coadapt-job-storage"
  role   = aws_iam_role.job_storage.id
  policy = data.aws_iam_policy_document.job_storage.json
}

# With team_store: the store's master credential, and nothing else in Secrets Manager (a policy
# of its own, attached only then; a customer key is used for it through Secrets Manager only).
data "aws_iam_policy_document" "controller_store" {
  count = local.team_store ? 1 : 0

  statement {
    sid       = "ReadStoreSecret"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [local.store.secret_arn]
  }

  dynamic "statement" {
    for_each = var.kms_key_arn == null ? [] : [var.kms_key_arn]
    content {
      sid       = "StoreSecretKey"
      actions   = ["kms:Decrypt"]
      resources = [statement.value]
      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = ["secretsmanager.${var.region}.amazonaws.com"]
      }
    }
  }
}

resource "aws_iam_role_policy" "controller_store" {
  count  = local.team_store ? 1 : 0
  name   = "coadapt-controller-store"
  role   = aws_iam_role.controller.id
  policy = data.aws_iam_policy_document.controller_store[0].json
}
