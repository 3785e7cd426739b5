//! Flap damping: how many consecutive check results it takes before the
//! status a connector shows for an application changes (HAProxy's
//! `rise`/`fall`, Envoy's healthy/unhealthy thresholds, Consul's
//! `success_before_passing`/`failures_before_critical`).
//!
//! A result *worse* than the shown status (Up → Unhealthy → Down) must be
//! seen `fall` times in a row before it shows, a *better* one `rise` times
//! in a row; a result equal to the shown status, or one in the other
//! direction, starts the count again. When the count is reached the latest
//! result shows (so Up, Down, Unhealthy, Down with `fall = 3` shows Down).
//! The first result of an application shows at once (there is nothing to
//! damp against, and a user may be waiting for it), and so does Unknown,
//! which is no check result. `1 / 1` shows every result at once: the
//! behaviour without damping.

use crate::status::Status;

/// Most consecutive results `rise` or `fall` may ask for: at the shortest
/// report interval worth running (seconds), a hundred rounds is already
/// minutes of hiding a real outage.
pub const MAX_THRESHOLD: u32 = 100;

/// A segment's thresholds. Invariant: both are `1..=MAX_THRESHOLD`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Damping {
    rise: u32,
    fall: u32,
}

impl Default for Damping {
    fn default() -> Self {
        Damping { rise: 1, fall: 1 }
    }
}

impl Damping {
    /// Thresholds, or `None` when either is outside `1..=MAX_THRESHOLD`.
    pub fn new(rise: u32, fall: u32) -> Option<Self> {
        let ok = |n: u32| (1..=MAX_THRESHOLD).contains(&n);
        (ok(rise) && ok(fall)).then_some(Damping { rise, fall })
    }

    /// Consecutive better results needed to show an improvement.
    pub fn rise(self) -> u32 {
        self.rise
    }

    /// Consecutive worse results needed to show a degradation.
    pub fn fall(self) -> u32 {
        self.fall
    }
}

/// Rank of a check result: higher is better; Unknown has none.
fn rank(status: Status) -> Option<u8> {
    match status {
        Status::Up => Some(2),
        Status::Unhealthy => Some(1),
        Status::Down => Some(0),
        Status::Unknown => None,
    }
}

/// The damped status of one application on one connector.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Damper {
    shown: Option<Status>,
    /// Consecutive results on the `worse` side of `shown` so far.
    streak: u32,
    worse: bool,
}

impl Damper {
    /// The status shown now (`None` before the first result).
    pub fn shown(&self) -> Option<Status> {
        self.shown
    }

    /// How many results in a row have disagreed with the shown status, and
    /// whether they were worse (0 when the last result agreed).
    pub fn pending(&self) -> (u32, bool) {
        (self.streak, self.worse)
    }

    /// Takes one round's `raw` status and returns the status to show.
    pub fn observe(&mut self, raw: Status, damping: Damping) -> Status {
        let (Some(shown), Some(new), Some(old)) =
            (self.shown, rank(raw), self.shown.and_then(rank))
        else {
            // First result, Unknown shown, or an Unknown result: at once.
            return self.show(raw);
        };
        if new == old {
            self.streak = 0;
            return shown;
        }
        let worse = new < old;
        if self.streak == 0 || worse != self.worse {
            self.streak = 0;
            self.worse = worse;
        }
        self.streak += 1;
        let needed = if worse { damping.fall } else { damping.rise };
        if self.streak >= needed {
            self.show(raw)
        } else {
            shown
        }
    }

    fn show(&mut self, status: Status) -> Status {
        self.shown = Some(status);
        self.streak = 0;
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Status::{Down, Unhealthy, Unknown, Up};

    fn run(damping: Damping, raws: &[Status]) -> Vec<Status> {
        let mut d = Damper::default();
        raws.iter().map(|&r| d.observe(r, damping)).collect()
    }

    #[test]
    fn one_one_shows_every_result_at_once() {
        let raws = [Up, Down, Up, Unhealthy, Down, Unknown, Up];
        assert_eq!(run(Damping::default(), &raws), raws.to_vec());
    }

    #[test]
    fn alternating_results_do_not_flap_with_fall_three() {
        let d = Damping::new(1, 3).expect("valid");
        let raws: Vec<Status> = (0..20)
            .map(|i| if i % 2 == 0 { Up } else { Down })
            .collect();
        assert!(run(d, &raws).iter().all(|&s| s == Up));
        // Two failures in a row are not enough either.
        assert_eq!(run(d, &[Up, Down, Down, Up, Down]), vec![Up; 5]);
    }

    #[test]
    fn fall_consecutive_failures_turn_down_and_rise_successes_turn_up() {
        let d = Damping::new(2, 3).expect("valid");
        assert_eq!(
            run(d, &[Up, Down, Down, Down, Up, Down, Up, Up, Up]),
            vec![Up, Up, Up, Down, Down, Down, Down, Up, Up]
        );
    }

    #[test]
    fn the_latest_result_shows_when_the_count_is_reached() {
        // Unhealthy and Down are both worse than Up: they count together.
        let d = Damping::new(1, 3).expect("valid");
        assert_eq!(
            run(d, &[Up, Unhealthy, Down, Unhealthy]),
            vec![Up, Up, Up, Unhealthy]
        );
        // A better result in between starts the count again.
        let d = Damping::new(2, 2).expect("valid");
        assert_eq!(
            run(d, &[Unhealthy, Down, Up, Down, Down]),
            vec![Unhealthy, Unhealthy, Unhealthy, Unhealthy, Down]
        );
    }

    #[test]
    fn first_and_unknown_results_show_at_once() {
        let d = Damping::new(5, 5).expect("valid");
        assert_eq!(run(d, &[Down]), vec![Down]);
        assert_eq!(run(d, &[Up, Unknown, Down]), vec![Up, Unknown, Down]);
        let mut damper = Damper::default();
        damper.observe(Up, d);
        damper.observe(Down, d);
        assert_eq!(damper.pending(), (1, true));
        assert_eq!(damper.shown(), Some(Up));
    }

    #[test]
    fn thresholds_are_bounded() {
        assert!(Damping::new(0, 1).is_none());
        assert!(Damping::new(1, 0).is_none());
        assert!(Damping::new(1, MAX_THRESHOLD + 1).is_none());
        let d = Damping::new(MAX_THRESHOLD, 1).expect("valid");
        assert_eq!((d.rise(), d.fall()), (MAX_THRESHOLD, 1));
    }
}
