# The VPC network (made here unless `network` is given), Cloud NAT for outbound access without
# external addresses, and the firewall rules. No rule admits 0.0.0.0/0.

resource "google_compute_network" "coadapt" {
  #checkov:skip=CKV2_GCP_18:The firewall rules below attach to this network through local.network_self_link (this network, or the deployer's own), a conditional reference checkov's graph does not follow; GCP's default rules are not created for a custom network.
  count = local.create_network ? 1 : 0

  project                 = var.project
  name                    = "${local.prefix}-net"
  description             = "coadapt cluster ${var.cluster_id}: controller and GPU nodes"
  auto_create_subnetworks = false
  routing_mode            = "REGIONAL"
}

resource "google_compute_subnetwork" "coadapt" {
  count = local.create_network ? 1 : 0

  project       = var.project
  name          = "${local.prefix}-subnet"
  description   = "coadapt cluster ${var.cluster_id}: controller and GPU nodes"
  region        = var.region
  network       = google_compute_network.coadapt[0].id
  ip_cidr_range = var.subnet_cidr

  # No node has an external address: Google APIs (Secret Manager, Cloud Storage, Compute) are
  # reached through Private Google Access.
  private_ip_google_access = true

  log_config {
    aggregation_interval = "INTERVAL_10_MIN"
    flow_sampling        = 0.5
    metadata             = "INCLUDE_ALL_METADATA"
  }
}

# Outbound internet (pip install of coadapt on the controller and the nodes) for instances
# without external addresses. Only with a module-made network: an existing network brings its
# own egress.
resource "google_compute_router" "coadapt" {
  count = local.create_network ? 1 : 0

  project     = var.project
  name        = "${local.prefix}-router"
  description = "coadapt cluster ${var.cluster_id}: Cloud NAT router"
  region      = var.region
  network     = google_compute_network.coadapt[0].id
}

resource "google_compute_router_nat" "coadapt" {
  count = local.create_network ? 1 : 0

  project                            = var.project
  name                               = "${local.prefix}-nat"
  router                             = google_compute_router.coadapt[0].name
  region                             = var.region
  nat_ip_allocate_option             = "AUTO_ONLY"
  source_subnetwork_ip_ranges_to_nat = "LIST_OF_SUBNETWORKS"

  subnetwork {
    name                    = google_compute_subnetwork.coadapt[0].self_link
    source_ip_ranges_to_nat = ["ALL_IP_RANGES"]
  }

  log_config {
    enable = true
    filter = "ERRORS_ONLY"
  }
}

# Nodes talk to each other on every TCP port (distributed training: NCCL, torch rendezvous,
# the agents' peer addresses).
resource "google_compute_firewall" "nodes_internal" {
  project     = var.project
  name        = "${local.prefix}-nodes"
  description = "coadapt ${var.cluster_id}: GPU nodes to GPU nodes, all TCP ports"
  network     = local.network_self_link
  direction   = "INGRESS"
  source_tags = [local.node_tag]
  target_tags = [local.node_tag]

  allow {
    protocol = "tcp"
  }

  log_config {
    metadata = "INCLUDE_ALL_METADATA"
  }
}

# The agents on the nodes report to the controller's API.
resource "google_compute_firewall" "nodes_to_controller" {
  project     = var.project
  name        = "${local.prefix}-node-to-ctl"
  description = "coadapt ${var.cluster_id}: GPU nodes to the controller API port"
  network     = local.network_self_link
  direction   = "INGRESS"
  source_tags = [local.node_tag]
  target_tags = [local.controller_tag]

  allow {
    protocol = "tcp"
    ports    = [tostring(var.controller_port)]
  }

  log_config {
    metadata = "INCLUDE_ALL_METADATA"
  }
}

# Users' CLIs (and `coadapt destroy`) reach the API from these ranges; none by default.
resource "google_compute_firewall" "api" {
  count = length(var.api_allowed_cidrs) > 0 ? 1 : 0

  project       = var.project
  name          = "${local.prefix}-api"
  description   = "coadapt ${var.cluster_id}: api_allowed_cidrs to the controller API port"
  network       = local.network_self_link
  direction     = "INGRESS"
  source_ranges = var.api_allowed_cidrs
  target_tags   = [local.controller_tag]

  allow {
    protocol = "tcp"
    ports    = [tostring(var.controller_port)]
  }

  log_config {
    metadata = "INCLUDE_ALL_METADATA"
  }
}

# SSH (OS Login) to the controller and the nodes from these ranges; none by default.
resource "google_compute_firewall" "ssh" {
  count = length(var.ssh_allowed_cidrs) > 0 ? 1 : 0

  project       = var.project
  name          = "${local.prefix}-ssh"
  description   = "coadapt ${var.cluster_id}: ssh_allowed_cidrs to port 22 of the controller and nodes"
  network       = local.network_self_link
  direction     = "INGRESS"
  source_ranges = var.ssh_allowed_cidrs
  target_tags   = [local.controller_tag, local.node_tag]

  allow {
    protocol = "tcp"
    ports    = ["22"]
  }

  log_config {
    metadata = "INCLUDE_ALL_METADATA"
  }
}
