//! The figure model, `target/bench/results.json` and the printed table.
//!
//! Every figure carries its baseline (measured in the same run) and the
//! ratio value / baseline; a figure with no baseline has `baseline: null`
//! and its goal in its own unit. A figure that could not be produced has
//! `value: null` and `met: false`, with the reason in `note`.

use serde::{Deserialize, Serialize};

/// What a figure must reach.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Goal {
    /// value / baseline ≥ ratio (throughputs).
    RatioAtLeast {
        /// The smallest acceptable ratio.
        ratio: f64,
    },
    /// value / baseline ≤ ratio (CPU and other costs against a bare
    /// baseline).
    RatioAtMost {
        /// The largest acceptable ratio.
        ratio: f64,
    },
    /// value ≥ limit, in the figure's unit.
    AtLeast {
        /// The limit.
        limit: f64,
    },
    /// value ≤ limit, in the figure's unit.
    AtMost {
        /// The limit.
        limit: f64,
    },
    /// |value − target| ≤ tolerance, in the figure's unit.
    Within {
        /// The target.
        target: f64,
        /// The tolerance.
        tolerance: f64,
    },
    /// No goal: the figure is published for context.
    Info,
}

/// One row of the table.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Figure {
    /// Stable identifier, e.g. `tcp_checks_per_s`.
    pub name: String,
    /// The measured value (`None`: could not be produced; see `note`).
    pub value: Option<f64>,
    /// The bare baseline measured in the same run, if the figure has one.
    pub baseline: Option<f64>,
    /// value / baseline.
    pub ratio: Option<f64>,
    /// The goal as a ratio (`RatioAtLeast`) or in the figure's unit.
    pub goal: Option<f64>,
    /// Unit of `value` and `baseline`.
    pub unit: String,
    /// Whether the goal is met (`None` for figures without a goal).
    pub met: Option<bool>,
    /// The goal in words, e.g. "≥ 80% of baseline".
    pub goal_text: String,
    /// What was measured, or why it could not be.
    pub note: String,
}

impl Figure {
    /// A figure with a value, an optional baseline and a goal.
    pub fn new(
        name: &str,
        unit: &str,
        value: f64,
        baseline: Option<f64>,
        goal: Goal,
        note: impl Into<String>,
    ) -> Self {
        let ratio = baseline.filter(|b| *b != 0.0).map(|b| value / b);
        let (goal_value, met, goal_text) = match goal {
            Goal::RatioAtLeast { ratio: g } => (
                Some(g),
                Some(ratio.is_some_and(|r| r >= g)),
                format!("≥ {:.0}% of baseline", g * 100.0),
            ),
            Goal::RatioAtMost { ratio: g } => (
                Some(g),
                Some(ratio.is_some_and(|r| r <= g)),
                format!("≤ {}× baseline", trim(g)),
            ),
            Goal::AtLeast { limit } => (
                Some(limit),
                Some(value >= limit),
                format!("≥ {} {unit}", trim(limit)),
            ),
            Goal::AtMost { limit } => (
                Some(limit),
                Some(value <= limit),
                format!("≤ {} {unit}", trim(limit)),
            ),
            Goal::Within { target, tolerance } => (
                Some(target),
                Some((value - target).abs() <= tolerance),
                format!("{} ± {} {unit}", trim(target), trim(tolerance)),
            ),
            Goal::Info => (None, None, String::new()),
        };
        Figure {
            name: name.to_owned(),
            value: Some(value),
            baseline,
            ratio,
            goal: goal_value,
            unit: unit.to_owned(),
            met,
            goal_text,
            note: note.into(),
        }
    }

    /// A figure that could not be produced in this run.
    pub fn missing(name: &str, unit: &str, goal: Goal, why: impl Into<String>) -> Self {
        let mut f = Figure::new(name, unit, 0.0, None, goal, why);
        f.value = None;
        f.ratio = None;
        f.met = match goal {
            Goal::Info => None,
            _ => Some(false),
        };
        f
    }
}

fn trim(x: f64) -> String {
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// `results.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Results {
    /// The machine the numbers came from.
    pub machine: String,
    /// `quick` or `full`.
    pub mode: String,
    /// When the run ended (Unix seconds).
    pub finished_unix_s: u64,
    /// One entry per table row.
    pub figures: Vec<Figure>,
}

/// A number for the table: 3 significant digits, thousands unseparated.
pub fn fmt_num(x: Option<f64>) -> String {
    match x {
        None => "—".to_owned(),
        Some(0.0) => "0".to_owned(),
        Some(x) => {
            let a = x.abs();
            if a >= 1000.0 {
                format!("{x:.0}")
            } else if a >= 100.0 {
                format!("{x:.1}")
            } else if a >= 1.0 {
                format!("{x:.2}")
            } else {
                format!("{x:.4}")
            }
        }
    }
}

/// The table printed at the end of a run.
pub fn table(results: &Results) -> String {
    let header = [
        "figure", "value", "baseline", "ratio", "unit", "goal", "met",
    ];
    let rows: Vec<[String; 7]> = results
        .figures
        .iter()
        .map(|f| {
            [
                f.name.clone(),
                fmt_num(f.value),
                fmt_num(f.baseline),
                f.ratio.map_or("—".to_owned(), |r| format!("{r:.2}")),
                f.unit.clone(),
                if f.goal_text.is_empty() {
                    "—".to_owned()
                } else {
                    f.goal_text.clone()
                },
                match f.met {
                    Some(true) => "yes".to_owned(),
                    Some(false) => "NO".to_owned(),
                    None => "—".to_owned(),
                },
            ]
        })
        .collect();
    let mut widths = header.map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            let pad = w - cell.chars().count();
            // Names, units and goals left-aligned, numbers right-aligned.
            if matches!(i, 0 | 4 | 5 | 6) {
                s.push_str(cell);
                s.push_str(&" ".repeat(pad));
            } else {
                s.push_str(&" ".repeat(pad));
                s.push_str(cell);
            }
            s.push_str("  ");
        }
        s.trim_end().to_owned()
    };
    let mut out = format!("machine: {} ({} mode)\n", results.machine, results.mode);
    out.push_str(&line(&header.map(str::to_owned)));
    out.push('\n');
    out.push_str(&line(&widths.map(|w| "-".repeat(w))));
    out.push('\n');
    for row in &rows {
        out.push_str(&line(row));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_goals_compare_value_over_baseline() {
        let f = Figure::new(
            "tcp_checks_per_s",
            "checks/s",
            27000.0,
            Some(33000.0),
            Goal::RatioAtLeast { ratio: 0.8 },
            "",
        );
        assert_eq!(f.met, Some(true));
        assert!((f.ratio.unwrap() - 0.818).abs() < 0.001);
        assert_eq!(f.goal, Some(0.8));
    }

    #[test]
    fn a_missing_figure_is_not_met() {
        let f = Figure::missing("x", "B", Goal::AtMost { limit: 1.0 }, "no API");
        assert_eq!(f.value, None);
        assert_eq!(f.met, Some(false));
        let json = serde_json::to_value(&f).unwrap();
        assert!(json["value"].is_null());
    }

    #[test]
    fn cost_goals_compare_value_over_baseline_from_above() {
        let g = Goal::RatioAtMost { ratio: 1.2 };
        let f = Figure::new("cpu", "µs CPU", 11.0, Some(10.0), g, "");
        assert_eq!(f.met, Some(true));
        assert_eq!(f.goal_text, "≤ 1.2× baseline");
        assert_eq!(
            Figure::new("cpu", "µs CPU", 13.0, Some(10.0), g, "").met,
            Some(false)
        );
        // No baseline: the ratio is unknown, so the goal is not met.
        assert_eq!(
            Figure::new("cpu", "µs CPU", 1.0, None, g, "").met,
            Some(false)
        );
        let floor = Goal::AtLeast { limit: 10000.0 };
        assert_eq!(
            Figure::new("r", "/s", 9999.0, None, floor, "").met,
            Some(false)
        );
        assert_eq!(
            Figure::new("r", "/s", 10000.0, None, floor, "").met,
            Some(true)
        );
    }

    #[test]
    fn within_goal() {
        let g = Goal::Within {
            target: 20.0,
            tolerance: 0.05,
        };
        assert_eq!(Figure::new("r", "/s", 19.97, None, g, "").met, Some(true));
        assert_eq!(Figure::new("r", "/s", 19.9, None, g, "").met, Some(false));
    }
}
