//! The in-process figures, measured by criterion (`crates/policy/benches`)
//! and read back from its `estimates.json` files: `policy::select` with 10,
//! 100 and 1,000 candidates (and the nearest strategy at 100), matching against 10,000 segments next to
//! 10, and a decision's explanation among 10,000 candidates (from a roster) next to 32.

use std::path::Path;

use anyhow::{Context, Result};

use super::Spec;
use crate::report::{Figure, Goal};

/// The figures.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "policy_select_ns_10",
        unit: "ns/decision",
        goal: Goal::Info,
    },
    Spec {
        name: "policy_select_ns_100",
        unit: "ns/decision",
        goal: Goal::AtMost { limit: 1000.0 },
    },
    Spec {
        name: "policy_select_ns_1000",
        unit: "ns/decision",
        goal: Goal::Info,
    },
    Spec {
        name: "policy_select_nearest_ns_100",
        unit: "ns/decision",
        goal: Goal::AtMost { limit: 2000.0 },
    },
    Spec {
        name: "policy_match_ns_10000_segments",
        unit: "ns/request",
        goal: Goal::Info,
    },
    Spec {
        name: "policy_explain_us_10000",
        unit: "µs/decision",
        goal: Goal::RatioAtMost { ratio: 2.0 },
    },
];

/// The mean of one benchmark, in ns.
fn mean_ns(dir: &Path, id: &str) -> Result<f64> {
    let path = dir.join(id).join("new").join("estimates.json");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "reading {} (did `cargo bench -p policy` run?)",
            path.display()
        )
    })?;
    let v: serde_json::Value = serde_json::from_str(&text)?;
    v["mean"]["point_estimate"]
        .as_f64()
        .with_context(|| format!("no mean in {}", path.display()))
}

/// Reads the figures from criterion's output directory.
pub fn read(dir: &Path) -> Vec<Figure> {
    let mut out = Vec::new();
    for (spec, n) in SPECS.iter().zip([10, 100, 1000]) {
        let figure = mean_ns(dir, &format!("select/healthy/{n}")).map(|healthy| {
            let group = mean_ns(dir, &format!("select/group/{n}"))
                .map_or_else(|_| "n/a".to_owned(), |g| format!("{g:.0} ns"));
            spec.figure(
                healthy,
                None,
                format!(
                    "criterion mean, healthy strategy, {n} connected candidates (¼ Down); \
                     group strategy: {group}"
                ),
            )
        });
        out.push(figure.unwrap_or_else(|e| spec.missing(format!("{e:#}"))));
    }
    let nearest = mean_ns(dir, "select/nearest/100").map(|ns| {
        SPECS[3].figure(
            ns,
            None,
            "criterion mean, nearest strategy, 100 connected candidates (¼ Down) with smoothed \
             RTTs spread over 0.5-50 ms, default tolerance (20 % or 2 ms)",
        )
    });
    out.push(nearest.unwrap_or_else(|e| SPECS[3].missing(format!("{e:#}"))));
    let matching = mean_ns(dir, "match/segments/10000").and_then(|big| {
        Ok(SPECS[4].figure(
            big,
            Some(mean_ns(dir, "match/segments/10")?),
            "criterion mean over a mix of exact, wildcard, IP and unmatched requests; \
             baseline = the same requests against 10 segments",
        ))
    });
    out.push(matching.unwrap_or_else(|e| SPECS[4].missing(format!("{e:#}"))));
    let explain = mean_ns(dir, "explain/roster/10000").and_then(|big| {
        let slice = mean_ns(dir, "explain/healthy/10000")
            .map_or_else(|_| "n/a".to_owned(), |ns| format!("{:.1} µs", ns / 1000.0));
        Ok(SPECS[5].figure(
            big / 1000.0,
            Some(mean_ns(dir, "explain/healthy/32")? / 1000.0),
            format!(
                "criterion mean, healthy strategy, from the `Roster` the CA keeps per \
                 application: 10,000 connected candidates (¼ Down), 32 listed with their \
                 sentences, all counted; baseline = the slice of 32 candidates; the slice \
                 of 10,000: {slice}"
            ),
        ))
    });
    out.push(explain.unwrap_or_else(|e| SPECS[5].missing(format!("{e:#}"))));
    out
}
