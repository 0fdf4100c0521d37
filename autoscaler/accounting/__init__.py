"""What a cluster cost and did: the cost ledger and records (``costs``), the bill from the
controller's store (``billing``), the cost reports (``report/``) and the dashboard page."""
