"""coadapt's action plane: cloud provider adapters behind one contract (``providers.base``).

Cloud SDKs (boto3, google-cloud-compute) are imported only inside their adapter packages
(``providers.aws``, ``providers.gcp``), so the core installs and runs without them.
"""
