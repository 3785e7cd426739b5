//! Policy dry-run: what a policy costs each connector group (checks per
//! cycle, cycle time against each segment's report interval, the check
//! budget) and what changing from one policy to another adds and removes per
//! group, computed from the policies alone (no DNS, no connectors), for
//! `central-authority plan`.
//!
//! FQDNs count as `addresses_per_fqdn` addresses each, as the CA's own
//! budget estimate does before any connector reports (`estimated_checks`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Serialize, Serializer};

use crate::location::Location;
use crate::model::{AppKey, DnsResolution, HealthReporting, Policy, Segment};
use crate::plan::{estimate_budget, estimated_checks};

/// What the estimate assumes about the connectors that will run the policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PlanParams {
    /// Checks per second one connector starts (its rate limit).
    pub checks_per_second: u32,
    /// Checks per cycle above which a connector is over budget.
    pub check_budget: u64,
    /// Addresses each FQDN is assumed to resolve to.
    pub addresses_per_fqdn: u64,
}

/// One segment as a group serves it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SegmentPlan {
    /// Segment name.
    pub name: String,
    /// Health reporting mode.
    pub health_reporting: HealthReporting,
    /// Report interval.
    #[serde(rename = "report_interval_seconds", serialize_with = "seconds")]
    pub report_interval: Duration,
    /// Estimated check targets (addresses × ports), whatever the mode.
    pub targets: u64,
    /// Checks this segment adds to every cycle: its targets when
    /// continuous, 0 otherwise (on-access checks run only while users
    /// access, `none` never checks).
    pub checks_per_cycle: u64,
    /// A continuous segment whose group's cycle takes longer than its report
    /// interval: its applications are re-checked only once per cycle, so
    /// most reports repeat old results.
    pub cycle_exceeds_interval: bool,
}

/// One connector group's load under a policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GroupPlan {
    /// Group name.
    pub name: String,
    /// The segments it serves, in policy order.
    pub segments: Vec<SegmentPlan>,
    /// Checks per cycle of each of its connectors (continuous segments).
    pub checks_per_cycle: u64,
    /// Time one cycle takes at the rate limit.
    #[serde(rename = "cycle_seconds", serialize_with = "seconds")]
    pub cycle: Duration,
    /// `checks_per_cycle` exceeds the budget.
    pub over_budget: bool,
    /// Sentences an operator should read before applying the policy.
    pub warnings: Vec<String>,
}

/// A whole policy's dry-run: one entry per connector group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PolicyPlan {
    /// The assumptions.
    pub params: PlanParams,
    /// Groups in policy order.
    pub groups: Vec<GroupPlan>,
}

impl PolicyPlan {
    /// Every group's warnings, each prefixed with its group.
    pub fn warnings(&self) -> Vec<String> {
        self.groups
            .iter()
            .flat_map(|g| {
                g.warnings
                    .iter()
                    .map(move |w| format!("group {:?}: {w}", g.name))
            })
            .collect()
    }
}

/// Plans every group of `policy`.
pub fn plan_policy(policy: &Policy, params: PlanParams) -> PolicyPlan {
    let groups = policy
        .connector_groups
        .iter()
        .map(|g| plan_group(policy, &g.name, params))
        .collect();
    PolicyPlan { params, groups }
}

/// Plans one group: its segments, checks per cycle, cycle time and warnings.
pub fn plan_group(policy: &Policy, group: &str, params: PlanParams) -> GroupPlan {
    let mut segments: Vec<SegmentPlan> = policy
        .segments_for_group(group)
        .map(|s| {
            let targets = estimated_checks(s, params.addresses_per_fqdn);
            SegmentPlan {
                name: s.name.clone(),
                health_reporting: s.health_reporting,
                report_interval: s.report_interval,
                targets,
                checks_per_cycle: if s.health_reporting == HealthReporting::Continuous {
                    targets
                } else {
                    0
                },
                cycle_exceeds_interval: false,
            }
        })
        .collect();
    let checks: u64 = segments.iter().map(|s| s.checks_per_cycle).sum();
    let estimate = estimate_budget(checks, params.checks_per_second, params.check_budget);
    let mut warnings = Vec::new();
    if estimate.over_budget {
        warnings.push(format!(
            "{} checks per cycle exceed the check budget of {}: a cycle takes {}, so reports are slow to reflect changes",
            checks,
            params.check_budget,
            human(estimate.cycle)
        ));
    }
    for s in &mut segments {
        if s.checks_per_cycle > 0 && estimate.cycle > s.report_interval {
            s.cycle_exceeds_interval = true;
            warnings.push(format!(
                "segment {:?}: the cycle ({}) is longer than its report interval ({}), so its applications are re-checked only once per cycle",
                s.name,
                human(estimate.cycle),
                human(s.report_interval)
            ));
        }
    }
    GroupPlan {
        name: group.to_owned(),
        segments,
        checks_per_cycle: checks,
        cycle: estimate.cycle,
        over_budget: estimate.over_budget,
        warnings,
    }
}

/// How a group fares in a change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupChange {
    /// The group exists only in the new policy.
    Added,
    /// The group exists only in the current policy.
    Removed,
    /// The group is in both and something it serves changed.
    Changed,
    /// The group is in both and serves the same segments, unchanged.
    Unchanged,
}

/// A segment in both policies whose definition differs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SegmentChange {
    /// Segment name.
    pub name: String,
    /// The fields that differ, as named in the config file.
    pub fields: Vec<&'static str>,
}

/// What changing from the current policy to the new one does to one group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GroupDiff {
    /// Group name.
    pub group: String,
    /// Added, removed, changed or unchanged.
    pub change: GroupChange,
    /// Segments the group serves only under the new policy.
    pub segments_added: Vec<String>,
    /// Segments the group serves only under the current policy.
    pub segments_removed: Vec<String>,
    /// Segments the group serves under both, defined differently.
    pub segments_changed: Vec<SegmentChange>,
    /// Continuous check targets (segment, host, protocol, port) only under
    /// the new policy. FQDNs are counted as names, not addresses.
    pub targets_added: Vec<AppKey>,
    /// Continuous check targets only under the current policy.
    pub targets_removed: Vec<AppKey>,
    /// Checks per cycle under the current policy (0 for an added group).
    pub checks_per_cycle_before: u64,
    /// Checks per cycle under the new policy (0 for a removed group).
    pub checks_per_cycle_after: u64,
    /// The group's `dns_resolution` when the change alters it (a group in
    /// both policies only): which records its connectors will ask for, so
    /// which addresses they will check.
    pub dns_resolution: Option<DnsResolutionChange>,
    /// The group's `location` when the change alters it (a group in both
    /// policies only): what `nearest` weighs a user's distance against.
    pub location: Option<LocationChange>,
}

/// A group's `location` before and after a change (`None`: none set).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LocationChange {
    /// Under the current policy.
    pub before: Option<Location>,
    /// Under the new policy.
    pub after: Option<Location>,
}

/// A group's `dns_resolution` before and after a change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct DnsResolutionChange {
    /// Under the current policy.
    pub before: DnsResolution,
    /// Under the new policy.
    pub after: DnsResolution,
}

impl GroupDiff {
    /// `checks_per_cycle_after - checks_per_cycle_before`, saturated.
    pub fn checks_delta(&self) -> i64 {
        let after = i128::from(self.checks_per_cycle_after);
        let before = i128::from(self.checks_per_cycle_before);
        i64::try_from(after - before).unwrap_or(if after > before { i64::MAX } else { i64::MIN })
    }
}

/// Per group (the current policy's groups first, in order, then the new
/// policy's added groups), what moving from `current` to `new` changes.
pub fn diff_policies(current: &Policy, new: &Policy, params: PlanParams) -> Vec<GroupDiff> {
    let mut names: Vec<&str> = current
        .connector_groups
        .iter()
        .map(|g| g.name.as_str())
        .collect();
    for g in &new.connector_groups {
        if !names.contains(&g.name.as_str()) {
            names.push(&g.name);
        }
    }
    names
        .into_iter()
        .map(|g| diff_group(current, new, g, params))
        .collect()
}

/// What moving from `current` to `new` changes for `group`.
pub fn diff_group(current: &Policy, new: &Policy, group: &str, params: PlanParams) -> GroupDiff {
    let served = |p: &'_ Policy| -> BTreeMap<String, Segment> {
        p.segments_for_group(group)
            .map(|s| (s.name.clone(), s.clone()))
            .collect()
    };
    let (before, after) = (served(current), served(new));
    let segments_added = in_first_only(&after, &before);
    let segments_removed = in_first_only(&before, &after);
    let segments_changed: Vec<SegmentChange> = new
        .segments_for_group(group)
        .filter_map(|s| {
            let old = before.get(&s.name)?;
            let fields = changed_fields(old, s);
            (!fields.is_empty()).then(|| SegmentChange {
                name: s.name.clone(),
                fields,
            })
        })
        .collect();
    let (targets_before, targets_after) = (
        continuous_targets(current, group),
        continuous_targets(new, group),
    );
    let checks = |p: &Policy| plan_group(p, group, params).checks_per_cycle;
    let (in_current, in_new) = (current.has_group(group), new.has_group(group));
    let dns_resolution = match (current.group(group), new.group(group)) {
        (Some(b), Some(a)) if b.dns_resolution != a.dns_resolution => Some(DnsResolutionChange {
            before: b.dns_resolution,
            after: a.dns_resolution,
        }),
        _ => None,
    };
    let location = match (current.group(group), new.group(group)) {
        (Some(b), Some(a)) if b.location != a.location => Some(LocationChange {
            before: b.location,
            after: a.location,
        }),
        _ => None,
    };
    let change = match (in_current, in_new) {
        (false, _) => GroupChange::Added,
        (true, false) => GroupChange::Removed,
        (true, true)
            if segments_added.is_empty()
                && segments_removed.is_empty()
                && segments_changed.is_empty()
                && dns_resolution.is_none()
                && location.is_none() =>
        {
            GroupChange::Unchanged
        }
        (true, true) => GroupChange::Changed,
    };
    GroupDiff {
        group: group.to_owned(),
        change,
        segments_added,
        segments_removed,
        segments_changed,
        targets_added: targets_after.difference(&targets_before).cloned().collect(),
        targets_removed: targets_before.difference(&targets_after).cloned().collect(),
        checks_per_cycle_before: if in_current { checks(current) } else { 0 },
        checks_per_cycle_after: if in_new { checks(new) } else { 0 },
        dns_resolution,
        location,
    }
}

/// Names in `a` but not in `b`, in `a`'s (sorted) order.
fn in_first_only(a: &BTreeMap<String, Segment>, b: &BTreeMap<String, Segment>) -> Vec<String> {
    a.keys().filter(|k| !b.contains_key(*k)).cloned().collect()
}

/// The check targets of `group`'s continuous segments, FQDNs as names:
/// bounded, since a continuous segment has at most a handful of ports.
fn continuous_targets(policy: &Policy, group: &str) -> BTreeSet<AppKey> {
    policy
        .segments_for_group(group)
        .filter(|s| s.health_reporting == HealthReporting::Continuous)
        .flat_map(Segment::applications)
        .collect()
}

/// The config-file names of the fields in which two versions of a segment
/// differ (connector groups excepted: they decide which group sees it).
fn changed_fields(a: &Segment, b: &Segment) -> Vec<&'static str> {
    let mut out = Vec::new();
    let mut check = |differs: bool, field: &'static str| {
        if differs {
            out.push(field);
        }
    };
    check(a.applications != b.applications, "applications");
    check(a.tcp_ports != b.tcp_ports, "tcp_ports");
    check(a.udp_ports != b.udp_ports, "udp_ports");
    check(a.health_reporting != b.health_reporting, "health_reporting");
    check(a.report_interval != b.report_interval, "report_interval");
    check(a.multimatch != b.multimatch, "multimatch");
    check(
        a.client_hostname_validation != b.client_hostname_validation,
        "client_hostname_validation",
    );
    check(a.damping.rise() != b.damping.rise(), "rise");
    check(a.damping.fall() != b.damping.fall(), "fall");
    check(a.strategy != b.strategy, "strategy");
    out
}

/// A duration for people: `50 ms`, `1.5 s`, `300 s`.
pub fn human(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

fn seconds<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::location::LocationSpec;
    use crate::model::Protocol;
    use crate::validate::{GroupSpec, PolicySpec, SegmentSpec, validate};

    const PARAMS: PlanParams = PlanParams {
        checks_per_second: 20,
        check_budget: 6000,
        addresses_per_fqdn: 1,
    };

    fn seg(name: &str, apps: &[&str], tcp: &[&str], mode: &str, groups: &[&str]) -> SegmentSpec {
        SegmentSpec {
            name: name.into(),
            applications: apps.iter().map(|&a| a.into()).collect(),
            tcp_ports: tcp.iter().map(|&p| p.into()).collect(),
            health_reporting: Some(mode.into()),
            connector_groups: groups.iter().map(|&g| g.into()).collect(),
            ..SegmentSpec::default()
        }
    }

    fn policy(groups: &[&str], segments: Vec<SegmentSpec>) -> Policy {
        validate(&PolicySpec {
            connector_groups: groups
                .iter()
                .map(|&g| GroupSpec {
                    name: g.into(),
                    ..GroupSpec::default()
                })
                .collect(),
            segments,
        })
        .expect("valid policy")
    }

    fn key(segment: &str, host: &str, port: u16) -> AppKey {
        AppKey {
            segment: segment.into(),
            host: host.parse().expect("host"),
            protocol: Protocol::Tcp,
            port,
        }
    }

    #[test]
    fn a_group_counts_only_its_continuous_segments_per_cycle() {
        let p = policy(
            &["east", "west"],
            vec![
                seg(
                    "jira",
                    &["jira.corp.test", "10.1.1.1"],
                    &["80", "443"],
                    "continuous",
                    &["east"],
                ),
                seg(
                    "wiki",
                    &["10.1.1.2"],
                    &["80"],
                    "on_access",
                    &["east", "west"],
                ),
                seg("all", &["*.corp.test"], &["1-65535"], "none", &["west"]),
            ],
        );
        let plan = plan_policy(&p, PARAMS);
        assert_eq!(plan.groups.len(), 2);
        let east = &plan.groups[0];
        assert_eq!(east.name, "east");
        // (1 FQDN + 1 IP) x 2 ports; the on-access segment adds nothing.
        assert_eq!(east.checks_per_cycle, 4);
        assert_eq!(east.cycle, Duration::from_millis(200));
        assert!(!east.over_budget && east.warnings.is_empty());
        let names: Vec<_> = east.segments.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["jira", "wiki"]);
        assert_eq!(east.segments[1].targets, 1);
        assert_eq!(east.segments[1].checks_per_cycle, 0);
        let west = &plan.groups[1];
        assert_eq!(west.checks_per_cycle, 0);
        assert_eq!(west.cycle, Duration::ZERO);
        assert!(plan.warnings().is_empty());
    }

    #[test]
    fn fqdns_count_as_the_estimate_says() {
        let p = policy(
            &["east"],
            vec![seg(
                "jira",
                &["a.corp.test", "b.corp.test"],
                &["80"],
                "continuous",
                &["east"],
            )],
        );
        let params = PlanParams {
            addresses_per_fqdn: 3,
            ..PARAMS
        };
        assert_eq!(plan_policy(&p, params).groups[0].checks_per_cycle, 6);
    }

    #[test]
    fn over_budget_and_slow_cycles_warn_by_name() {
        // 701 IPs x 10 ports = 7010 checks: over 6000, and 350.5 s a cycle
        // at 20/s, longer than the 60 s interval of "big" and "small".
        let ips: Vec<String> = (0..701)
            .map(|i| format!("10.2.{}.{}", i / 250, i % 250 + 1))
            .collect();
        let ips: Vec<&str> = ips.iter().map(String::as_str).collect();
        let ports = ["1-10"];
        let mut slow = seg("slow", &["10.9.9.9"], &["22"], "continuous", &["east"]);
        slow.report_interval_s = Some(600);
        let p = policy(
            &["east"],
            vec![
                seg("big", &ips, &ports, "continuous", &["east"]),
                seg("small", &["10.9.9.8"], &["22"], "continuous", &["east"]),
                slow,
                seg("quiet", &["10.9.9.7"], &["22"], "on_access", &["east"]),
            ],
        );
        let g = &plan_policy(&p, PARAMS).groups[0];
        assert_eq!(g.checks_per_cycle, 7012);
        assert!(g.over_budget);
        assert_eq!(g.cycle, Duration::from_millis(350_600));
        let flagged: Vec<_> = g
            .segments
            .iter()
            .filter(|s| s.cycle_exceeds_interval)
            .map(|s| s.name.as_str())
            .collect();
        // A 600 s interval outlasts the cycle; on-access segments have none.
        assert_eq!(flagged, ["big", "small"]);
        let all = g.warnings.join("\n");
        assert!(
            all.contains("7012 checks per cycle exceed the check budget of 6000"),
            "{all}"
        );
        assert!(
            all.contains(
                "segment \"small\": the cycle (350.6 s) is longer than its report interval (60 s)"
            ),
            "{all}"
        );
        assert_eq!(g.warnings.len(), 3);
        // At the budget exactly there is no warning.
        let params = PlanParams {
            check_budget: 7012,
            checks_per_second: 1000,
            ..PARAMS
        };
        assert!(plan_policy(&p, params).groups[0].warnings.is_empty());
    }

    #[test]
    fn a_diff_lists_what_each_group_gains_and_loses() {
        let current = policy(
            &["east", "old"],
            vec![
                seg(
                    "jira",
                    &["jira.corp.test"],
                    &["80"],
                    "continuous",
                    &["east"],
                ),
                seg(
                    "gone",
                    &["10.1.1.9"],
                    &["22"],
                    "continuous",
                    &["east", "old"],
                ),
                seg("same", &["10.1.1.8"], &["22"], "on_access", &["east"]),
            ],
        );
        let new = policy(
            &["east", "fresh"],
            vec![
                seg(
                    "jira",
                    &["jira.corp.test", "10.1.1.1"],
                    &["80"],
                    "continuous",
                    &["east"],
                ),
                seg("same", &["10.1.1.8"], &["22"], "on_access", &["east"]),
                seg(
                    "wiki",
                    &["10.1.1.2"],
                    &["443"],
                    "continuous",
                    &["east", "fresh"],
                ),
            ],
        );
        let diffs = diff_policies(&current, &new, PARAMS);
        let groups: Vec<_> = diffs.iter().map(|d| (d.group.as_str(), d.change)).collect();
        assert_eq!(
            groups,
            [
                ("east", GroupChange::Changed),
                ("old", GroupChange::Removed),
                ("fresh", GroupChange::Added)
            ]
        );
        let east = &diffs[0];
        assert_eq!(east.segments_added, ["wiki"]);
        assert_eq!(east.segments_removed, ["gone"]);
        assert_eq!(
            east.segments_changed,
            [SegmentChange {
                name: "jira".into(),
                fields: vec!["applications"]
            }]
        );
        assert_eq!(
            east.targets_added,
            [key("jira", "10.1.1.1", 80), key("wiki", "10.1.1.2", 443)]
        );
        assert_eq!(east.targets_removed, [key("gone", "10.1.1.9", 22)]);
        assert_eq!(
            (east.checks_per_cycle_before, east.checks_per_cycle_after),
            (2, 3)
        );
        assert_eq!(east.checks_delta(), 1);
        let old = &diffs[1];
        assert_eq!(old.segments_removed, ["gone"]);
        assert_eq!(
            (old.checks_per_cycle_before, old.checks_per_cycle_after),
            (1, 0)
        );
        assert_eq!(old.checks_delta(), -1);
        let fresh = &diffs[2];
        assert_eq!(fresh.segments_added, ["wiki"]);
        assert_eq!(fresh.targets_added, [key("wiki", "10.1.1.2", 443)]);
        assert_eq!(
            (fresh.checks_per_cycle_before, fresh.checks_per_cycle_after),
            (0, 1)
        );
    }

    #[test]
    fn a_mode_change_moves_targets_in_and_out_of_the_cycle() {
        let current = policy(
            &["east"],
            vec![seg(
                "jira",
                &["10.1.1.1"],
                &["80", "443"],
                "continuous",
                &["east"],
            )],
        );
        let mut spec = seg(
            "jira",
            &["10.1.1.1"],
            &["80", "443"],
            "on_access",
            &["east"],
        );
        spec.report_interval_s = Some(30);
        let new = policy(&["east"], vec![spec]);
        let d = &diff_policies(&current, &new, PARAMS)[0];
        assert_eq!(d.change, GroupChange::Changed);
        assert_eq!(
            d.segments_changed[0].fields,
            ["health_reporting", "report_interval"]
        );
        assert_eq!(
            d.targets_removed,
            [key("jira", "10.1.1.1", 80), key("jira", "10.1.1.1", 443)]
        );
        assert!(d.targets_added.is_empty());
        assert_eq!(d.checks_delta(), -2);
        // Back the other way, the same targets are added.
        let back = &diff_policies(&new, &current, PARAMS)[0];
        assert_eq!(back.targets_added, d.targets_removed);
    }

    #[test]
    fn a_changed_dns_resolution_changes_the_group() {
        let segs = || {
            vec![seg(
                "jira",
                &["jira.corp.test"],
                &["80"],
                "continuous",
                &["east", "west"],
            )]
        };
        let current = policy(&["east", "west"], segs());
        let mut spec = PolicySpec {
            connector_groups: ["east", "west"]
                .iter()
                .map(|&g| GroupSpec {
                    name: g.into(),
                    ..GroupSpec::default()
                })
                .collect(),
            segments: segs(),
        };
        spec.connector_groups[0].dns_resolution = Some("ipv4".into());
        let new = validate(&spec).expect("valid policy");
        let diffs = diff_policies(&current, &new, PARAMS);
        let east = &diffs[0];
        assert_eq!(east.change, GroupChange::Changed);
        assert_eq!(
            east.dns_resolution,
            Some(DnsResolutionChange {
                before: DnsResolution::Dual,
                after: DnsResolution::Ipv4
            })
        );
        assert!(east.segments_changed.is_empty() && east.targets_added.is_empty());
        let west = &diffs[1];
        assert_eq!(west.change, GroupChange::Unchanged);
        assert_eq!(west.dns_resolution, None);
        // Back again, the other way round.
        let back = &diff_policies(&new, &current, PARAMS)[0];
        assert_eq!(
            back.dns_resolution.map(|c| (c.before, c.after)),
            Some((DnsResolution::Ipv4, DnsResolution::Dual))
        );
    }

    #[test]
    fn a_changed_location_changes_the_group() {
        let segs = || {
            vec![seg(
                "jira",
                &["jira.corp.test"],
                &["80"],
                "on_access",
                &["east"],
            )]
        };
        let spec = |location: Option<LocationSpec>| PolicySpec {
            connector_groups: vec![GroupSpec {
                name: "east".into(),
                location,
                ..GroupSpec::default()
            }],
            segments: segs(),
        };
        let paris = LocationSpec {
            latitude: 48.85,
            longitude: 2.35,
        };
        let none = validate(&spec(None)).expect("valid policy");
        let located = validate(&spec(Some(paris))).expect("valid policy");
        let d = &diff_policies(&none, &located, PARAMS)[0];
        assert_eq!(d.change, GroupChange::Changed);
        let c = d.location.expect("a location change");
        assert_eq!(c.before, None);
        assert_eq!(c.after, Location::new(48.85, 2.35).ok());
        assert!(d.segments_changed.is_empty() && d.dns_resolution.is_none());
        assert_eq!(diff_policies(&located, &located, PARAMS)[0].location, None);
        assert_eq!(
            diff_policies(&located, &none, PARAMS)[0].change,
            GroupChange::Changed
        );
    }

    #[test]
    fn an_identical_policy_changes_nothing() {
        let p = policy(
            &["east", "west"],
            vec![seg(
                "jira",
                &["jira.corp.test"],
                &["80"],
                "continuous",
                &["east"],
            )],
        );
        for d in diff_policies(&p, &p, PARAMS) {
            assert_eq!(d.change, GroupChange::Unchanged, "{d:?}");
            assert!(d.targets_added.is_empty() && d.targets_removed.is_empty());
            assert_eq!(d.checks_delta(), 0);
        }
    }

    #[test]
    fn moving_a_segment_between_groups_shows_on_both() {
        let current = policy(
            &["east", "west"],
            vec![seg("jira", &["10.1.1.1"], &["80"], "continuous", &["east"])],
        );
        let new = policy(
            &["east", "west"],
            vec![seg("jira", &["10.1.1.1"], &["80"], "continuous", &["west"])],
        );
        let diffs = diff_policies(&current, &new, PARAMS);
        assert_eq!(diffs[0].segments_removed, ["jira"]);
        assert_eq!(diffs[0].targets_removed, [key("jira", "10.1.1.1", 80)]);
        assert_eq!(diffs[1].segments_added, ["jira"]);
        assert_eq!(diffs[1].targets_added, [key("jira", "10.1.1.1", 80)]);
        assert!(diffs.iter().all(|d| d.change == GroupChange::Changed));
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(human(Duration::from_millis(50)), "50 ms");
        assert_eq!(human(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(human(Duration::from_secs(300)), "300 s");
    }

    #[test]
    fn the_plan_serializes_with_seconds() {
        let p = policy(
            &["east"],
            vec![seg("jira", &["10.1.1.1"], &["80"], "continuous", &["east"])],
        );
        let json = serde_json_like(&plan_policy(&p, PARAMS));
        assert!(json.contains("cycle_seconds = 0.05"), "{json}");
        assert!(json.contains("report_interval_seconds = 60.0"), "{json}");
        assert!(json.contains("health_reporting = \"continuous\""), "{json}");
    }

    /// The policy crate has no JSON dependency; TOML shows the same field
    /// names and values.
    fn serde_json_like(plan: &PolicyPlan) -> String {
        toml::to_string(plan).expect("serializes")
    }
}
