# The checkpoint bucket: private, encrypted, versioned (an overwritten or deleted checkpoint is
# kept checkpoint_retention_days), TLS only.

resource "aws_s3_bucket" "checkpoints" {
  #checkov:skip=CKV_AWS_18:Server access logging needs a log bucket of the account's logging baseline; CloudTrail data events cover object access where required.
  #checkov:skip=CKV_AWS_144:Checkpoints are rewritten every few minutes and a lost one costs minutes of training: replicating them to another region costs more than it saves.
  #checkov:skip=CKV2_AWS_62:Nothing consumes bucket event notifications: the controller learns of checkpoints from the trainers' reports.
  #checkov:skip=CKV_AWS_145:Encrypted with SSE-KMS when kms_key_arn is given, else with S3-managed keys (a conditional checkov cannot evaluate).
  bucket_prefix = "coadapt-${substr(var.cluster_id, 0, 20)}-"
  force_destroy = false
  tags          = local.tags
}

resource "aws_s3_bucket_public_access_block" "checkpoints" {
  bucket                  = aws_s3_bucket.checkpoints.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id
  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = var.kms_key_arn == null ? "AES256" : "aws:kms"
      kms_master_key_id = var.kms_key_arn
    }
    bucket_key_enabled = var.kms_key_arn != null
  }
}

resource "aws_s3_bucket_versioning" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id

  rule {
    id     = "old-checkpoint-versions"
    status = "Enabled"
    filter {}
    noncurrent_version_expiration {
      noncurrent_days = var.checkpoint_retention_days
    }
    abort_incomplete_multipart_upload {
      days_after_initiation = 7
    }
  }

  depends_on = [aws_s3_bucket_versioning.checkpoints]
}

data "aws_iam_policy_document" "bucket" {
  statement {
    sid       = "TlsOnly"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.checkpoints.arn, "${aws_s3_bucket.checkpoints.arn}/*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "checkpoints" {
  bucket     = aws_s3_bucket.checkpoints.id
  policy     = data.aws_iam_policy_document.bucket.json
  depends_on = [aws_s3_bucket_public_access_block.checkpoints]
}
