//! Bounded time series: one value per fixed interval, the newest `N`
//! intervals kept in a ring of `u32`s, older ones overwritten. Time is an
//! argument (Unix milliseconds), never read here.
//!
//! Two series use it: the smoothed RTT per (application, connector) in the
//! health table (`RttSeries`: microseconds, the latest value of each
//! minute, one hour) and the check load per connector in the registry
//! (`LoadSeries`: checks per cycle, the highest of each five minutes, one
//! day). Their size is fixed, whatever the report rate: an `RttSeries` is
//! 248 bytes in an allocation of its own (made with the first RTT), so
//! 10,000 applications × 3 connectors hold about 7.9 MB of them
//! (docs/decisions.md, *Health table and reports*).

/// The value of an interval nothing was recorded in.
const EMPTY: u32 = u32::MAX;

/// How a value recorded into an interval that already has one combines
/// with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Merge {
    /// The interval shows the latest value (a smoothed figure: the latest
    /// already includes the earlier ones).
    Latest,
    /// The interval shows the highest value (a load: its peak counts).
    Max,
}

/// The newest `N` intervals of `INTERVAL_MS` milliseconds, one `u32` each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Series<const N: usize, const INTERVAL_MS: i64> {
    /// The number of the newest interval (`at_ms / INTERVAL_MS`), or
    /// `i64::MIN` when nothing was recorded; its value is at
    /// `values[newest mod N]`.
    newest: i64,
    values: [u32; N],
}

/// The smoothed RTT of one (application, connector), in microseconds: the
/// latest of each minute over the last hour.
pub type RttSeries = Series<60, 60_000>;

/// A connector's checks per cycle: the highest of each five minutes over
/// the last day.
pub type LoadSeries = Series<288, 300_000>;

impl<const N: usize, const INTERVAL_MS: i64> Default for Series<N, INTERVAL_MS> {
    fn default() -> Self {
        Series {
            newest: i64::MIN,
            values: [EMPTY; N],
        }
    }
}

/// A series as the API gives it: the value of each interval from the
/// oldest one with a value to the newest, `null` where nothing was
/// recorded.
#[derive(Clone, Debug, PartialEq)]
pub struct SeriesView<T> {
    /// Start of the first interval, Unix milliseconds.
    pub start: i64,
    /// Length of an interval, milliseconds: value `i` is of the interval
    /// starting at `start + i * interval_ms`.
    pub interval_ms: i64,
    /// One value per interval, oldest first.
    pub values: Vec<Option<T>>,
}

impl<const N: usize, const INTERVAL_MS: i64> Series<N, INTERVAL_MS> {
    /// Intervals kept.
    pub const POINTS: usize = N;
    /// Length of an interval, milliseconds.
    pub const INTERVAL_MS: i64 = INTERVAL_MS;

    fn slot(interval: i64) -> usize {
        // N is small: the remainder fits a usize.
        usize::try_from(interval.rem_euclid(N as i64)).unwrap_or(0)
    }

    /// Records `value` at `at_ms` (Unix ms): into the interval of `at_ms`,
    /// combined by `merge` with a value already there. A time before the
    /// oldest interval kept is ignored; one past the newest moves the
    /// series on, the skipped intervals left empty. `u32::MAX` is stored
    /// as `u32::MAX - 1`.
    pub fn record(&mut self, at_ms: i64, value: u32, merge: Merge) {
        let interval = at_ms.div_euclid(INTERVAL_MS);
        let value = value.min(EMPTY - 1);
        if self.newest == i64::MIN || interval - self.newest >= N as i64 {
            self.values = [EMPTY; N];
            self.newest = interval;
        } else if interval > self.newest {
            for skipped in self.newest + 1..=interval {
                self.values[Self::slot(skipped)] = EMPTY;
            }
            self.newest = interval;
        } else if self.newest - interval >= N as i64 {
            return;
        }
        let slot = &mut self.values[Self::slot(interval)];
        *slot = match merge {
            _ if *slot == EMPTY => value,
            Merge::Latest => value,
            Merge::Max => (*slot).max(value),
        };
    }

    /// The kept intervals from the oldest with a value to the newest, each
    /// value mapped by `f`; `None` when nothing was recorded.
    pub fn view<T>(&self, f: impl Fn(u32) -> T) -> Option<SeriesView<T>> {
        if self.newest == i64::MIN {
            return None;
        }
        let oldest = self.newest - (N as i64 - 1);
        let first = (oldest..=self.newest).find(|&i| self.values[Self::slot(i)] != EMPTY)?;
        Some(SeriesView {
            start: first.saturating_mul(INTERVAL_MS),
            interval_ms: INTERVAL_MS,
            values: (first..=self.newest)
                .map(|i| self.values[Self::slot(i)])
                .map(|v| (v != EMPTY).then(|| f(v)))
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Small = Series<4, 1_000>;

    fn values(s: &Small) -> Option<(i64, Vec<Option<u32>>)> {
        s.view(|v| v).map(|v| (v.start, v.values))
    }

    #[test]
    fn one_value_per_interval_latest_or_highest() {
        let mut s = Small::default();
        assert_eq!(values(&s), None);
        s.record(10_100, 5, Merge::Latest);
        s.record(10_900, 3, Merge::Latest);
        assert_eq!(values(&s), Some((10_000, vec![Some(3)])));
        let mut m = Small::default();
        m.record(10_100, 5, Merge::Max);
        m.record(10_900, 3, Merge::Max);
        m.record(11_000, 2, Merge::Max);
        assert_eq!(values(&m), Some((10_000, vec![Some(5), Some(2)])));
    }

    /// Skipped intervals are empty; the ring keeps the newest four, and
    /// a time older than those is ignored.
    #[test]
    fn the_ring_keeps_the_newest_intervals_with_gaps() {
        let mut s = Small::default();
        s.record(1_000, 1, Merge::Latest);
        s.record(3_500, 3, Merge::Latest);
        assert_eq!(values(&s), Some((1_000, vec![Some(1), None, Some(3)])));
        s.record(5_000, 5, Merge::Latest);
        // Interval 1 fell out: 2..=5 kept, the first with a value is 3.
        assert_eq!(values(&s), Some((3_000, vec![Some(3), None, Some(5)])));
        s.record(1_999, 9, Merge::Latest);
        assert_eq!(values(&s), Some((3_000, vec![Some(3), None, Some(5)])));
        // An older interval still kept takes its value.
        s.record(4_000, 4, Merge::Latest);
        assert_eq!(values(&s), Some((3_000, vec![Some(3), Some(4), Some(5)])));
        // A jump past the whole ring leaves only the new value.
        s.record(60_000, 6, Merge::Latest);
        assert_eq!(values(&s), Some((60_000, vec![Some(6)])));
        s.record(61_000, u32::MAX, Merge::Latest);
        assert_eq!(
            values(&s),
            Some((60_000, vec![Some(6), Some(u32::MAX - 1)]))
        );
    }

    /// However many values are recorded, at most `N` intervals are kept.
    #[test]
    fn a_long_run_stays_within_its_bound() {
        let mut s = RttSeries::default();
        for minute in 0..1_000_i64 {
            for second in [0, 30] {
                s.record(minute * 60_000 + second * 1_000, 7, Merge::Latest);
            }
        }
        let v = s.view(|v| v).expect("recorded");
        assert_eq!(v.values.len(), RttSeries::POINTS);
        assert_eq!(v.start, (1_000 - 60) * 60_000);
        assert_eq!(v.interval_ms, 60_000);
        // The memory figure in docs/decisions.md.
        assert_eq!(std::mem::size_of::<RttSeries>(), 248);
    }
}
