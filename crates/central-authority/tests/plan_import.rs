//! The real `central-authority` binary's `plan` and `import` subcommands:
//! what they print, their exit codes, and that they start nothing.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::scratch_dir;

const BIN: &str = env!("CARGO_BIN_EXE_central-authority");

fn run(args: &[&str], dir: &Path) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env("RUST_LOG", "info")
        .output()
        .expect("run")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

const GROUPS: &str = r#"
[server]
grpc_listen = "127.0.0.1:1"
http_listen = "127.0.0.1:2"
data_dir = "must-not-exist"

[[connector_groups]]
name = "dc-east"
provisioning_key = "key-east-B0osmy39tFGyyrktfUA4bq08"

[[connector_groups]]
name = "dc-west"
provisioning_key = "key-west-xJdfkuf189GgDwSbDpdZ9av8"
"#;

/// `GROUPS` with dc-west asking for A records only.
const GROUPS_V4_WEST: &str = r#"
[server]
grpc_listen = "127.0.0.1:1"
http_listen = "127.0.0.1:2"
data_dir = "must-not-exist"

[[connector_groups]]
name = "dc-east"
provisioning_key = "key-east-B0osmy39tFGyyrktfUA4bq08"

[[connector_groups]]
name = "dc-west"
provisioning_key = "key-west-xJdfkuf189GgDwSbDpdZ9av8"
dns_resolution = "ipv4"
"#;

const CURRENT: &str = r#"
[[segments]]
name = "jira"
applications = ["jira.lanukcorp.test", "10.1.1.1"]
tcp_ports = ["80"]
udp_ports = ["3389"]
health_reporting = "continuous"
connector_groups = ["dc-east"]

[[segments]]
name = "legacy"
applications = ["10.1.9.9"]
tcp_ports = ["22"]
connector_groups = ["dc-west"]
"#;

const NEW: &str = r#"
[health]
check_budget = 5

[[segments]]
name = "jira"
applications = ["jira.lanukcorp.test", "10.1.1.1", "10.1.1.2"]
tcp_ports = ["80"]
udp_ports = ["3389"]
health_reporting = "continuous"
report_interval_s = 1
connector_groups = ["dc-east"]

[[segments]]
name = "wiki"
applications = ["*.wiki.lanukcorp.test"]
tcp_ports = ["443"]
health_reporting = "on_access"
connector_groups = ["dc-east", "dc-west"]
"#;

fn write_configs(dir: &Path) {
    std::fs::write(dir.join("current.toml"), format!("{GROUPS}{CURRENT}")).expect("write");
    std::fs::write(dir.join("new.toml"), format!("{GROUPS}{NEW}")).expect("write");
}

#[test]
fn plan_prints_a_table_per_group_and_starts_nothing() {
    let dir = scratch_dir("plan-text");
    write_configs(&dir);
    let out = run(&["plan", "new.toml"], &dir);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    for needle in [
        "new.toml: OK (2 connector groups, 2 segments, 0 API tokens)",
        "assuming 20 checks/s per connector, a check budget of 5 per cycle",
        // 3 addresses x 2 ports = 6 checks: over 5, and 300 ms a cycle.
        "group \"dc-east\": 6 checks per cycle, cycle 300 ms, OVER BUDGET (5)",
        "  jira     continuous  1 s       6        6",
        "  wiki     on_access   60 s      0        -",
        "warning: 6 checks per cycle exceed the check budget of 5",
        "group \"dc-west\": 0 checks per cycle, cycle 0 ms\n",
        "\n1 warning(s)\n",
    ] {
        assert!(stdout.contains(needle), "{needle:?} missing in:\n{stdout}");
    }
    assert!(!stdout.contains("changes from"), "{stdout}");
    // No data directory, no listener: nothing was started.
    assert!(!dir.join("must-not-exist").exists());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn plan_with_current_shows_what_each_group_gains_and_loses() {
    let dir = scratch_dir("plan-diff");
    write_configs(&dir);
    let out = run(&["plan", "new.toml", "--current", "current.toml"], &dir);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    for needle in [
        "changes from current.toml:",
        "group \"dc-east\" (changed): checks per cycle 4 -> 6 (+2)\n",
        "  + segment \"wiki\"\n",
        "  ~ segment \"jira\": applications, report_interval\n",
        "  + target 10.1.1.2:80/tcp (segment \"jira\")\n",
        "  + target 10.1.1.2:3389/udp (segment \"jira\")\n",
        "group \"dc-west\" (changed): checks per cycle 1 -> 0 (-1)\n",
        "  - segment \"legacy\"\n",
        "  - target 10.1.9.9:22/tcp (segment \"legacy\")\n",
    ] {
        assert!(stdout.contains(needle), "{needle:?} missing in:\n{stdout}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn plan_with_current_reports_a_changed_dns_resolution_and_location_per_group() {
    let dir = scratch_dir("plan-dns");
    std::fs::write(dir.join("current.toml"), format!("{GROUPS}{CURRENT}")).expect("write");
    std::fs::write(dir.join("new.toml"), format!("{GROUPS_V4_WEST}{CURRENT}")).expect("write");
    let out = run(&["plan", "new.toml", "--current", "current.toml"], &dir);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    for needle in [
        "group \"dc-east\": no change (4 checks per cycle)\n",
        "group \"dc-west\" (changed): checks per cycle 1 -> 1 (+0)\n  ~ dns_resolution dual -> ipv4\n",
    ] {
        assert!(stdout.contains(needle), "{needle:?} missing in:\n{stdout}");
    }
    // dc-east gets a location (what `nearest` weighs a user's distance to).
    let located = GROUPS_V4_WEST.replace(
        "name = \"dc-east\"\n",
        "name = \"dc-east\"\nlocation = { latitude = 48.85, longitude = 2.35 }\n",
    );
    std::fs::write(dir.join("located.toml"), format!("{located}{CURRENT}")).expect("write");
    let out = run(&["plan", "located.toml", "--current", "new.toml"], &dir);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    for needle in [
        "group \"dc-east\" (changed): checks per cycle 4 -> 4 (+0)\n  ~ location none -> (48.85, 2.35)\n",
        "group \"dc-west\": no change (1 checks per cycle)\n",
    ] {
        assert!(stdout.contains(needle), "{needle:?} missing in:\n{stdout}");
    }
    let out = run(
        &[
            "plan",
            "new.toml",
            "--current",
            "current.toml",
            "--format",
            "json",
        ],
        &dir,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    let west = json["changes"]
        .as_array()
        .and_then(|c| c.iter().find(|g| g["group"] == "dc-west"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(west["change"], "changed", "{west}");
    assert_eq!(west["dns_resolution"]["before"], "dual", "{west}");
    assert_eq!(west["dns_resolution"]["after"], "ipv4", "{west}");
    let east = json["changes"]
        .as_array()
        .and_then(|c| c.iter().find(|g| g["group"] == "dc-east"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(east["dns_resolution"], serde_json::Value::Null, "{east}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn plan_json_is_one_document_with_the_same_figures() {
    let dir = scratch_dir("plan-json");
    write_configs(&dir);
    let out = run(
        &[
            "plan",
            "new.toml",
            "--current",
            "current.toml",
            "--format",
            "json",
        ],
        &dir,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(json["valid"], true);
    assert_eq!(json["file"], "new.toml");
    assert_eq!(json["current"], "current.toml");
    assert_eq!(json["params"]["check_budget"], 5);
    let east = &json["groups"][0];
    assert_eq!(east["name"], "dc-east");
    assert_eq!(east["checks_per_cycle"], 6);
    assert_eq!(east["cycle_seconds"], 0.3);
    assert_eq!(east["over_budget"], true);
    assert_eq!(east["segments"][0]["report_interval_seconds"], 1.0);
    assert_eq!(json["warnings"].as_array().map(Vec::len), Some(1));
    let changes = json["changes"].as_array().expect("changes");
    assert_eq!(changes[0]["group"], "dc-east");
    assert_eq!(changes[0]["segments_added"][0], "wiki");
    assert_eq!(
        changes[0]["segments_changed"][0]["fields"][0],
        "applications"
    );
    assert_eq!(changes[0]["targets_added"][0]["host"], "10.1.1.2");
    assert_eq!(changes[1]["checks_per_cycle_after"], 0);
    assert_eq!(changes[1]["targets_removed"][0]["port"], 22);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn plan_of_an_invalid_file_lists_every_error_and_fails() {
    let dir = scratch_dir("plan-bad");
    write_configs(&dir);
    std::fs::write(
        dir.join("bad.toml"),
        format!(
            "{GROUPS}{}",
            r#"
[[segments]]
name = "big"
applications = ["*.example.test"]
tcp_ports = ["1-11"]
connector_groups = ["dc-north"]
"#
        ),
    )
    .expect("write");
    let out = run(&["plan", "bad.toml", "--current", "current.toml"], &dir);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    let stderr = text(&out.stderr);
    for needle in [
        "is not allowed with 11 ports (max 10)",
        "application discovery segment",
        "unknown connector group \"dc-north\"",
        "bad.toml: configuration is invalid",
    ] {
        assert!(stderr.contains(needle), "{needle:?} missing in:\n{stderr}");
    }
    // JSON output says so too, for a CI that reads stdout.
    let out = run(&["plan", "bad.toml", "--format", "json"], &dir);
    assert!(!out.status.success());
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(json["valid"], false);
    assert_eq!(json["errors"].as_array().map(Vec::len), Some(3));
    // An invalid --current fails the same way.
    let out = run(&["plan", "new.toml", "--current", "bad.toml"], &dir);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("bad.toml: configuration is invalid"));
    let _ = std::fs::remove_dir_all(dir);
}

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn import_of_a_clean_export_exits_zero_and_passes_check_config() {
    let dir = scratch_dir("import-clean");
    let out = run(
        &[
            "import",
            &fixture("import-clean.json"),
            "--group-map",
            "SG East=dc-east",
            "--group-map",
            "SG West=dc-west",
        ],
        &dir,
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let toml = text(&out.stdout);
    assert!(toml.contains("[[segments]]\nname = \"jira\""), "{toml}");
    assert!(
        stderr.contains("3 segment(s) imported, 0 finding(s); exit code 0"),
        "{stderr}"
    );
    std::fs::write(dir.join("ca.toml"), format!("{GROUPS}{toml}")).expect("write");
    let check = run(&["check-config", "ca.toml"], &dir);
    assert!(check.status.success(), "{}", text(&check.stderr));
    assert!(text(&check.stdout).contains("2 connector groups, 3 segments"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn import_reports_every_loss_by_name_and_says_so_in_its_exit_code() {
    let dir = scratch_dir("import-page");
    let out = run(
        &[
            "import",
            &fixture("import-page.json"),
            "--group-map",
            "SG East=dc-east",
            "--output",
            "segments.toml",
        ],
        &dir,
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(out.stdout.is_empty());
    for needle in [
        "segment \"Jira Server\": note: named \"Jira-Server\"",
        "segment \"extras\": not carried over: fields reach has no equivalent for: bypassType",
        "segment \"half-mapped\": not carried over: server group \"SG Lab\"",
        "segment \"retired\": refused: is disabled",
        "segment \"many-ports\": refused: health_reporting = \"continuous\" is not allowed with 12 ports",
        "segment \"wild\": refused:",
        "segment \"inclusive-continuous\": refused: multimatch",
        "segment \"lab-only\": refused: none of its server groups",
        "4 segment(s) imported",
    ] {
        assert!(stderr.contains(needle), "{needle:?} missing in:\n{stderr}");
    }
    let toml = std::fs::read_to_string(dir.join("segments.toml")).expect("output file");
    std::fs::write(dir.join("ca.toml"), format!("{GROUPS}{toml}")).expect("write");
    let check = run(&["check-config", "ca.toml"], &dir);
    assert!(check.status.success(), "{}", text(&check.stderr));

    assert!(
        toml.contains("name = \"near\"") && toml.contains("strategy = \"nearest\""),
        "selectConnectorCloseToApp becomes the nearest strategy: {toml}"
    );

    // selectConnectorCloseToApp carries over: 0.
    std::fs::write(
        dir.join("near.json"),
        r#"[{"name": "near", "domainNames": ["10.1.1.1"], "tcpPortRanges": ["22", "22"],
             "selectConnectorCloseToApp": true, "serverGroups": [{"name": "SG East"}]}]"#,
    )
    .expect("write");
    let out = run(
        &["import", "near.json", "--group-map", "SG East=dc-east"],
        &dir,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("strategy = \"nearest\""));

    // Fields lost but every segment kept: 3.
    std::fs::write(
        dir.join("extras.json"),
        r#"[{"name": "extras", "domainNames": ["10.1.1.1"], "tcpPortRanges": ["22", "22"],
             "bypassType": "NEVER", "serverGroups": [{"name": "SG East"}]}]"#,
    )
    .expect("write");
    let out = run(
        &["import", "extras.json", "--group-map", "SG East=dc-east"],
        &dir,
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn import_of_unusable_input_writes_nothing_and_exits_one() {
    let dir = scratch_dir("import-bad");
    std::fs::write(dir.join("bad.json"), r#"{"totalPages": "1"}"#).expect("write");
    let out = run(&["import", "bad.json", "--output", "out.toml"], &dir);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("an object without \"list\""));
    assert!(!dir.join("out.toml").exists());
    let out = run(&["import", "missing.json"], &dir);
    assert_eq!(out.status.code(), Some(1));
    // A malformed --group-map is a usage error.
    let out = run(&["import", "bad.json", "--group-map", "nothing"], &dir);
    assert_eq!(out.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(dir);
}
