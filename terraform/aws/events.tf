# EC2's interruption events (spot two-minute warnings, rebalance recommendations, state
# changes) go through EventBridge to an SQS queue the controller reads
# (sqs:ReceiveMessage / sqs:DeleteMessageBatch on this queue only).

# SQS-managed encryption, whatever kms_key_arn says: with a customer key, EventBridge and the
# controller would need KMS permissions beyond the declared list.
resource "aws_sqs_queue" "interruptions" {
  name                      = "${local.prefix}-interruptions"
  message_retention_seconds = 3600
  receive_wait_time_seconds = 0
  sqs_managed_sse_enabled   = true
  tags                      = local.tags
}

resource "aws_cloudwatch_event_rule" "interruptions" {
  name        = "${local.prefix}-interruptions"
  description = "coadapt ${var.cluster_id}: EC2 spot warnings, rebalance recommendations and state changes"
  event_pattern = jsonencode({
    source = ["aws.ec2"]
    detail-type = [
      "EC2 Spot Instance Interruption Warning",
      "EC2 Instance Rebalance Recommendation",
      "EC2 Instance State-change Notification",
    ]
  })
  tags = local.tags
}

resource "aws_cloudwatch_event_target" "interruptions" {
  rule      = aws_cloudwatch_event_rule.interruptions.name
  target_id = "coadapt-queue"
  arn       = aws_sqs_queue.interruptions.arn
}

data "aws_iam_policy_document" "queue" {
  statement {
    sid       = "FromTheRuleOnly"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.interruptions.arn]
    principals {
      type        = "Service"
      identifiers = ["events.amazonaws.com"]
    }
    condition {
      test     = "ArnEquals"
      variable = "aws:SourceArn"
      values   = [aws_cloudwatch_event_rule.interruptions.arn]
    }
  }
}

resource "aws_sqs_queue_policy" "interruptions" {
  queue_url = aws_sqs_queue.interruptions.id
  policy    = data.aws_iam_policy_document.queue.json
}
