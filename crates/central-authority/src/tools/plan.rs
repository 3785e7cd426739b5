//! `central-authority plan`: formats the policy crate's dry-run
//! (`policy::plan_policy`, `policy::diff_policies`) of a validated config,
//! optionally against the config running now, as a text table or JSON.
//! Nothing here starts a listener, opens the data directory or resolves a
//! name: FQDNs count as the CA's own budget estimate counts them.

use std::fmt::Write as _;

use policy::{GroupChange, GroupDiff, PlanParams, PolicyPlan};
use serde::Serialize;

use crate::{Config, Settings};

/// Addresses each FQDN is assumed to resolve to: the CA's budget estimate
/// counts one per FQDN until a connector reports its real cycle.
pub const ADDRESSES_PER_FQDN: u64 = 1;

/// The assumptions the CA itself would make for a connector of this config
/// that has not reported yet: the imposed rate, else the assumed one.
pub fn params(settings: &Settings) -> PlanParams {
    PlanParams {
        checks_per_second: policy::effective_rate(
            settings.connector_checks_per_second,
            None,
            &[settings.assumed_checks_per_second],
        ),
        check_budget: settings.check_budget,
        addresses_per_fqdn: ADDRESSES_PER_FQDN,
    }
}

/// A dry-run of one config, with the change from the current one if given.
#[derive(Clone, Debug, Serialize)]
pub struct PlanReport {
    /// The new config's file name, as given.
    pub file: String,
    /// Always true: an invalid config yields `invalid_json` instead.
    pub valid: bool,
    /// What the config holds (`Config::summary`).
    pub summary: String,
    /// Per-group load and the assumptions behind it.
    #[serde(flatten)]
    pub plan: PolicyPlan,
    /// Every warning, prefixed with its group.
    pub warnings: Vec<String>,
    /// The current config's file name, with `--current`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
    /// Per-group change from the current config, with `--current`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changes: Option<Vec<GroupDiff>>,
}

/// Plans `new` (read from `file`), and its change from `current`.
pub fn report(file: &str, new: &Config, current: Option<(&str, &Config)>) -> PlanReport {
    let params = params(&new.settings);
    let plan = policy::plan_policy(&new.policy, params);
    PlanReport {
        file: file.to_owned(),
        valid: true,
        summary: new.summary(),
        warnings: plan.warnings(),
        plan,
        current: current.map(|(name, _)| name.to_owned()),
        changes: current.map(|(_, c)| policy::diff_policies(&c.policy, &new.policy, params)),
    }
}

/// The JSON an invalid config yields (the errors go to stderr as well).
pub fn invalid_json(file: &str, errors: &[String]) -> String {
    #[derive(Serialize)]
    struct Invalid<'a> {
        file: &'a str,
        valid: bool,
        errors: &'a [String],
    }
    serde_json::to_string_pretty(&Invalid {
        file,
        valid: false,
        errors,
    })
    .unwrap_or_default()
}

impl PlanReport {
    /// Pretty-printed JSON.
    pub fn json(&self) -> String {
        // Serializing plain structs of strings and numbers cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// The text table for people.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let p = &self.plan.params;
        let _ = writeln!(out, "{}: OK ({})", self.file, self.summary);
        let _ = writeln!(
            out,
            "assuming {} checks/s per connector, a check budget of {} per cycle, {} address(es) per FQDN",
            p.checks_per_second, p.check_budget, p.addresses_per_fqdn
        );
        for g in &self.plan.groups {
            out.push('\n');
            let _ = write!(
                out,
                "group {:?}: {} checks per cycle, cycle {}",
                g.name,
                g.checks_per_cycle,
                policy::dryrun::human(g.cycle)
            );
            if g.over_budget {
                let _ = write!(out, ", OVER BUDGET ({})", p.check_budget);
            }
            out.push('\n');
            if g.segments.is_empty() {
                out.push_str("  (serves no segment)\n");
            } else {
                out.push_str(&segment_table(g));
            }
            for w in &g.warnings {
                let _ = writeln!(out, "  warning: {w}");
            }
        }
        if let (Some(current), Some(changes)) = (&self.current, &self.changes) {
            let _ = writeln!(out, "\nchanges from {current}:");
            for d in changes {
                out.push_str(&diff_text(d));
            }
        }
        let _ = writeln!(out, "\n{} warning(s)", self.warnings.len());
        out
    }
}

/// One row per segment, columns padded to their widest cell.
fn segment_table(g: &policy::GroupPlan) -> String {
    let mut rows = vec![[
        "SEGMENT".to_owned(),
        "MODE".to_owned(),
        "INTERVAL".to_owned(),
        "TARGETS".to_owned(),
        "CHECKS/CYCLE".to_owned(),
        "NOTE".to_owned(),
    ]];
    for s in &g.segments {
        let continuous = s.health_reporting == policy::HealthReporting::Continuous;
        rows.push([
            s.name.clone(),
            s.health_reporting.to_string(),
            policy::dryrun::human(s.report_interval),
            s.targets.to_string(),
            if continuous {
                s.checks_per_cycle.to_string()
            } else {
                "-".to_owned()
            },
            if s.cycle_exceeds_interval {
                "cycle > interval".to_owned()
            } else {
                String::new()
            },
        ]);
    }
    // The note column only when some segment has a note.
    let columns = if g.segments.iter().any(|s| s.cycle_exceeds_interval) {
        6
    } else {
        5
    };
    let mut widths = [0usize; 6];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (w, cell) in widths.iter().zip(row).take(columns) {
            let _ = write!(line, "  {cell:<w$}");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn diff_text(d: &GroupDiff) -> String {
    let mut out = String::new();
    let what = match d.change {
        GroupChange::Unchanged => {
            let _ = writeln!(
                out,
                "group {:?}: no change ({} checks per cycle)",
                d.group, d.checks_per_cycle_after
            );
            return out;
        }
        GroupChange::Added => "added",
        GroupChange::Removed => "removed",
        GroupChange::Changed => "changed",
    };
    let _ = writeln!(
        out,
        "group {:?} ({what}): checks per cycle {} -> {} ({:+})",
        d.group,
        d.checks_per_cycle_before,
        d.checks_per_cycle_after,
        d.checks_delta()
    );
    if let Some(c) = d.dns_resolution {
        let _ = writeln!(out, "  ~ dns_resolution {} -> {}", c.before, c.after);
    }
    if let Some(c) = d.location {
        let shown =
            |l: Option<policy::Location>| l.map_or_else(|| "none".to_owned(), |l| l.to_string());
        let _ = writeln!(
            out,
            "  ~ location {} -> {}",
            shown(c.before),
            shown(c.after)
        );
    }
    for s in &d.segments_added {
        let _ = writeln!(out, "  + segment {s:?}");
    }
    for s in &d.segments_removed {
        let _ = writeln!(out, "  - segment {s:?}");
    }
    for s in &d.segments_changed {
        let _ = writeln!(out, "  ~ segment {:?}: {}", s.name, s.fields.join(", "));
    }
    for t in &d.targets_added {
        let _ = writeln!(out, "  + target {t}");
    }
    for t in &d.targets_removed {
        let _ = writeln!(out, "  - target {t}");
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn config(segments: &str, health: &str) -> Config {
        let text = format!(
            r#"
[health]
{health}
[[connector_groups]]
name = "dc-east"
provisioning_key = "k-east-SPN7GC8UwIT4NmlyZDirxbgy"
[[connector_groups]]
name = "dc-west"
provisioning_key = "k-west-w33vx75meVgGbFFyR4aO2Frz"
{segments}"#
        );
        Config::from_toml(&text, Path::new("."))
            .unwrap_or_else(|e| panic!("{}", e.messages().join("\n")))
    }

    const JIRA: &str = r#"
[[segments]]
name = "jira"
applications = ["jira.example.test", "10.1.1.1"]
tcp_ports = ["80", "443"]
connector_groups = ["dc-east"]
"#;

    const WIKI: &str = r#"
[[segments]]
name = "wiki"
applications = ["10.1.1.2"]
tcp_ports = ["8000-8100"]
health_reporting = "on_access"
connector_groups = ["dc-east", "dc-west"]
"#;

    #[test]
    fn params_follow_the_settings_the_ca_would_use() {
        let c = config("", "");
        assert_eq!(
            params(&c.settings),
            PlanParams {
                checks_per_second: 20,
                check_budget: 6000,
                addresses_per_fqdn: 1
            }
        );
        let c = config("", "checks_per_second = 50\nassumed_checks_per_second = 5");
        assert_eq!(params(&c.settings).checks_per_second, 50);
        let c = config("", "assumed_checks_per_second = 5\ncheck_budget = 10");
        assert_eq!(params(&c.settings).checks_per_second, 5);
        assert_eq!(params(&c.settings).check_budget, 10);
    }

    #[test]
    fn text_shows_a_table_per_group_and_the_changes() {
        let old = config(JIRA, "");
        let new = config(&format!("{JIRA}{WIKI}"), "check_budget = 3");
        let text = report("new.toml", &new, Some(("old.toml", &old))).text();
        for needle in [
            "new.toml: OK (2 connector groups, 2 segments, 0 API tokens)",
            "assuming 20 checks/s per connector, a check budget of 3 per cycle",
            "group \"dc-east\": 4 checks per cycle, cycle 200 ms, OVER BUDGET (3)",
            "  SEGMENT  MODE        INTERVAL  TARGETS  CHECKS/CYCLE\n",
            "  jira     continuous  60 s      4        4\n",
            "  wiki     on_access   60 s      101      -\n",
            "warning: 4 checks per cycle exceed the check budget of 3",
            "group \"dc-west\": 0 checks per cycle, cycle 0 ms\n",
            "changes from old.toml:",
            "group \"dc-east\" (changed): checks per cycle 4 -> 4 (+0)\n  + segment \"wiki\"\n",
            "group \"dc-west\" (changed): checks per cycle 0 -> 0 (+0)\n  + segment \"wiki\"\n",
            "\n1 warning(s)\n",
        ] {
            assert!(text.contains(needle), "{needle:?} missing in:\n{text}");
        }
        let same = report("new.toml", &new, Some(("new.toml", &new))).text();
        assert!(
            same.contains("group \"dc-west\": no change (0 checks per cycle)"),
            "{same}"
        );
    }

    #[test]
    fn json_carries_the_same_figures() {
        let old = config(JIRA, "");
        let new = config(WIKI, "");
        let json: serde_json::Value =
            serde_json::from_str(&report("new.toml", &new, Some(("old.toml", &old))).json())
                .expect("json");
        assert_eq!(json["valid"], true);
        assert_eq!(json["params"]["checks_per_second"], 20);
        assert_eq!(json["groups"][0]["name"], "dc-east");
        assert_eq!(json["groups"][0]["segments"][0]["targets"], 101);
        assert_eq!(json["current"], "old.toml");
        let east = &json["changes"][0];
        assert_eq!(east["change"], "changed");
        assert_eq!(east["segments_removed"][0], "jira");
        assert_eq!(east["targets_removed"].as_array().map(Vec::len), Some(4));
        assert_eq!(east["checks_per_cycle_before"], 4);
        assert_eq!(east["checks_per_cycle_after"], 0);
        // Without --current there is no change section.
        let plain: serde_json::Value =
            serde_json::from_str(&report("new.toml", &new, None).json()).expect("json");
        assert!(plain.get("changes").is_none() && plain.get("current").is_none());
        let bad: serde_json::Value =
            serde_json::from_str(&invalid_json("x.toml", &["e1".into()])).expect("json");
        assert_eq!(bad["valid"], false);
        assert_eq!(bad["errors"][0], "e1");
    }
}
