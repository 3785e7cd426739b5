//! The figures, one module per group. Each group measures reach and its
//! bare baseline back to back in the same run; a group that fails yields
//! its figures with `value: null`, `met: false` and the error as the note,
//! and the driver's run then exits non-zero naming them.

pub mod access;
pub mod appcheck;
pub mod batching;
pub mod burst;
pub mod ca;
pub mod cluster;
pub mod cold;
pub mod criterion;
pub mod dashboard;
pub mod database;
pub mod decisions;
pub mod detect;
pub mod dns;
pub mod events;
pub mod fleet;
pub mod ha;
pub mod icmp;
pub mod ingest;
pub mod logstream;
pub mod memory;
pub mod onaccess;
pub mod pacing;
pub mod peers;
pub mod replicas;
pub mod scale;
pub mod sizes;
pub mod spray;
pub mod startup;
pub mod starve;
pub mod storm;
pub mod tcp;

use crate::report::{Figure, Goal};

/// A figure's name, unit and goal, known before it is measured.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    /// Name.
    pub name: &'static str,
    /// Unit.
    pub unit: &'static str,
    /// Goal.
    pub goal: Goal,
}

impl Spec {
    /// The figure with a measured value.
    pub fn figure(&self, value: f64, baseline: Option<f64>, note: impl Into<String>) -> Figure {
        Figure::new(self.name, self.unit, value, baseline, self.goal, note)
    }

    /// The figure when it could not be measured.
    pub fn missing(&self, why: impl Into<String>) -> Figure {
        Figure::missing(self.name, self.unit, self.goal, why)
    }
}

/// Every group, in the order the driver runs them.
pub const GROUPS: &[&str] = &[
    "policy",
    "tcp",
    "appcheck",
    "icmp",
    "dns",
    "pacing",
    "memory",
    "ingest",
    "batching",
    "access",
    "cold",
    "detect",
    "scale",
    "onaccess",
    "starve",
    "dashboard",
    "sizes",
    "spray",
    "events",
    "burst",
    "ha",
    "storm",
    "database",
    "startup",
    "replicas",
    "logstream",
    "peers",
];

/// The specs of a group (for the missing-figure fallback).
pub fn specs(group: &str) -> &'static [Spec] {
    match group {
        "policy" => criterion::SPECS,
        "tcp" => tcp::SPECS,
        "appcheck" => appcheck::SPECS,
        "icmp" => icmp::SPECS,
        "dns" => dns::SPECS,
        "pacing" => pacing::SPECS,
        "memory" => memory::SPECS,
        "ingest" => ingest::SPECS,
        "batching" => batching::SPECS,
        "access" => access::SPECS,
        "cold" => cold::SPECS,
        "detect" => detect::SPECS,
        "scale" => scale::SPECS,
        "onaccess" => onaccess::SPECS,
        "starve" => starve::SPECS,
        "dashboard" => dashboard::SPECS,
        "sizes" => sizes::SPECS,
        "spray" => spray::SPECS,
        "events" => events::SPECS,
        "burst" => burst::SPECS,
        "ha" => ha::SPECS,
        "storm" => storm::SPECS,
        "database" => database::SPECS,
        "startup" => startup::SPECS,
        "replicas" => replicas::SPECS,
        "logstream" => logstream::SPECS,
        "peers" => peers::SPECS,
        _ => &[],
    }
}

/// Figures of a group that failed as a whole.
pub fn failed(group: &str, error: &anyhow::Error) -> Vec<Figure> {
    specs(group)
        .iter()
        .map(|s| s.missing(format!("not measured: {error:#}")))
        .collect()
}

/// Fills in a group's figures that its run did not produce.
pub fn complete(group: &str, mut figures: Vec<Figure>) -> Vec<Figure> {
    for spec in specs(group) {
        if !figures.iter().any(|f| f.name == spec.name) {
            figures.push(spec.missing("not produced by this run"));
        }
    }
    figures
}
