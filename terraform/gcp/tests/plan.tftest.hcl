# Offline plans of the module: mock providers (no credentials, no API call); the providers'
# binaries are needed for their schemas only (`terraform init` from a mirror).
mock_provider "google" {}
mock_provider "random" {}

variables {
  project    = "team-project-1"
  region     = "us-central1"
  zones      = ["us-central1-a", "us-central1-b"]
  cluster_id = "team-a"
  node_image = "projects/deeplearning-platform-release/global/images/family/common-cu123-debian-11-py310"
}

run "default_is_one_controller_with_its_sqlite_file" {
  command = plan
  assert {
    condition     = length(google_compute_instance.controller) == 1 && google_compute_instance.controller[0].name == "coadapt-team-a-controller" && google_compute_instance.controller[0].zone == "us-central1-a"
    error_message = "one controller, named and placed as before team_store"
  }
  assert {
    condition     = length(google_sql_database_instance.store) == 0 && length(google_sql_user.store) == 0 && length(google_secret_manager_secret.store_password) == 0 && length(google_secret_manager_secret_iam_member.controller_reads_store_password) == 0
    error_message = "no database, no password secret, no grant without team_store"
  }
  assert {
    condition     = length(google_compute_forwarding_rule.api) == 0 && length(google_compute_instance_group.controllers) == 0 && length(google_compute_firewall.health_checks_to_controllers) == 0 && length(google_service_networking_connection.store) == 0
    error_message = "no balancer, no private services access without team_store"
  }
  assert {
    condition     = output.store_endpoint == null && output.store_password_secret == null
    error_message = "no store outputs without team_store"
  }
}

run "team_store_plans_a_private_database_and_a_controller_pair" {
  command = plan
  variables {
    team_store = true
  }
  assert {
    condition     = [for vm in google_compute_instance.controller : vm.zone] == ["us-central1-a", "us-central1-b"]
    error_message = "two controllers, one in each of the first two zones"
  }
  assert {
    condition     = length(google_compute_instance_group.controllers) == 2 && google_compute_region_backend_service.api[0].load_balancing_scheme == "INTERNAL" && google_compute_forwarding_rule.api[0].load_balancing_scheme == "INTERNAL" && google_compute_forwarding_rule.api[0].ip_protocol == "TCP"
    error_message = "the pair behind an internal TCP balancer"
  }
  assert {
    condition     = google_sql_database_instance.store[0].database_version == "POSTGRES_15" && google_sql_database_instance.store[0].settings[0].ip_configuration[0].ipv4_enabled == false && google_sql_database_instance.store[0].settings[0].ip_configuration[0].ssl_mode == "ENCRYPTED_ONLY"
    error_message = "the store: PostgreSQL 15, no public IP, TLS required"
  }
  assert {
    condition     = google_sql_database_instance.store[0].settings[0].backup_configuration[0].enabled && google_sql_database_instance.store[0].settings[0].backup_configuration[0].point_in_time_recovery_enabled && google_sql_database_instance.store[0].deletion_protection && google_sql_database_instance.store[0].settings[0].deletion_protection_enabled && google_sql_database_instance.store[0].settings[0].availability_type == "REGIONAL"
    error_message = "the store: backed up, protected from deletion, regional"
  }
  assert {
    condition     = length(google_service_networking_connection.store) == 1 && google_sql_user.store[0].name == "coadapt" && google_sql_database.store[0].name == "coadapt"
    error_message = "private services access on the module's network, the store's database and user"
  }
  assert {
    condition     = length(google_secret_manager_secret_iam_member.controller_reads_store_password) == 1 && google_secret_manager_secret_iam_member.controller_reads_store_password[0].secret_id == "coadapt-team-a-store-password" && google_secret_manager_secret_iam_member.controller_reads_store_password[0].role == "roles/secretmanager.secretAccessor"
    error_message = "the controllers may read the store's password secret, by a binding on that secret"
  }
  assert {
    condition     = google_secret_manager_secret_iam_member.controller_adds_user_token.secret_id == "coadapt-team-a-user-token" && google_secret_manager_secret_iam_member.controller_adds_user_token.role == "roles/secretmanager.secretVersionAdder"
    error_message = "the users' token grant is unchanged"
  }
  assert {
    condition     = google_compute_firewall.health_checks_to_controllers[0].direction == "INGRESS" && length(setsubtract(google_compute_firewall.health_checks_to_controllers[0].source_ranges, ["35.191.0.0/16", "130.211.0.0/22"])) == 0 && google_compute_firewall.nodes_to_store[0].direction == "EGRESS"
    error_message = "health checkers to the controllers only; the nodes denied the store"
  }
  assert {
    condition     = output.store_password_secret == "coadapt-team-a-store-password"
    error_message = "the password's secret id is output (never the password)"
  }
}

run "three_controllers_over_two_zones" {
  command = plan
  variables {
    team_store       = true
    controller_count = 3
  }
  assert {
    condition     = [for vm in google_compute_instance.controller : vm.name] == ["coadapt-team-a-controller", "coadapt-team-a-controller-1", "coadapt-team-a-controller-2"] && [for vm in google_compute_instance.controller : vm.zone] == ["us-central1-a", "us-central1-b", "us-central1-a"]
    error_message = "controller i in zones[i mod 2]"
  }
  assert {
    condition     = length(google_compute_instance_group.controllers) == 2
    error_message = "one instance group per zone used"
  }
}

run "an_existing_network_brings_its_own_private_services_access" {
  command = plan
  variables {
    team_store              = true
    network                 = "shared"
    subnetwork              = "shared-us-central1"
    store_high_availability = false
  }
  assert {
    condition     = length(google_service_networking_connection.store) == 0 && google_sql_database_instance.store[0].settings[0].ip_configuration[0].private_network == "projects/team-project-1/global/networks/shared"
    error_message = "the store peers with the given network, whose access the module does not rewrite"
  }
  assert {
    condition     = google_sql_database_instance.store[0].settings[0].availability_type == "ZONAL"
    error_message = "store_high_availability = false: one zone"
  }
}

run "a_pair_without_the_team_store_is_refused" {
  command = plan
  variables {
    controller_count = 2
  }
  expect_failures = [google_compute_instance.controller]
}

run "four_controllers_are_refused" {
  command = plan
  variables {
    team_store       = true
    controller_count = 4
  }
  expect_failures = [var.controller_count]
}

run "a_store_without_backups_is_refused" {
  command = plan
  variables {
    team_store                  = true
    store_backup_retention_days = 0
  }
  expect_failures = [var.store_backup_retention_days]
}
