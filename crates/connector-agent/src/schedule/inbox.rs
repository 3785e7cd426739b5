//! A subscribed session's inbox: where the scheduler task leaves the
//! reports it produces for one CA session, and what wakes the session.
//!
//! The scheduler finishes a check round every few milliseconds, while a
//! session sends at most one batched report per `BATCH_WINDOW` (see
//! [`crate::send::outbox`]). A channel woke every session for every round (one
//! task wake-up, timer re-arm and, across worker threads, one futex wake
//! per round and replica): the cost of an extra replica grew with the check
//! rate. The inbox wakes its session only when the session has something to
//! decide: when results start to wait (the session computes when they are
//! due), when a user waits for one of them (`Outgoing::awaited`: due at
//! once), when a full report's worth waits, and when the scheduler is gone.
//! Results arriving in between are only appended; the session takes them
//! all when they are due and hands them to its outbox, which makes every
//! decision about batching, coalescing and flow control as before.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::send::report::Outgoing;

#[derive(Debug, Default)]
struct State {
    /// Results not taken yet, in arrival order.
    reports: Vec<Outgoing>,
    /// When the first of `reports` arrived.
    first: Option<Instant>,
    /// One of `reports` is awaited by a user.
    awaited: bool,
    /// Wake the session once this many results wait (0: no such wake).
    wake_len: usize,
    /// The scheduler dropped its end: nothing more will come.
    closed: bool,
    /// The session dropped its end: deliver nothing more.
    gone: bool,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    notify: Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The session's end of an inbox.
#[derive(Debug)]
pub struct Inbox {
    shared: Arc<Shared>,
}

/// The scheduler's end of an inbox.
#[derive(Debug)]
pub struct InboxSender {
    shared: Arc<Shared>,
}

/// A new inbox: the scheduler's end and the session's.
pub fn inbox() -> (InboxSender, Inbox) {
    let shared = Arc::new(Shared::default());
    (
        InboxSender {
            shared: shared.clone(),
        },
        Inbox { shared },
    )
}

impl InboxSender {
    /// Appends `batch` (arrived at `now`), waking the session when it has
    /// something to decide (see the module comment). False when the
    /// session is gone.
    pub fn deliver(&self, batch: Vec<Outgoing>, now: Instant) -> bool {
        if batch.is_empty() {
            return !self.is_closed();
        }
        let wake = {
            let mut s = self.shared.lock();
            if s.gone {
                return false;
            }
            let before = s.reports.len();
            let awaited = batch.iter().any(|r| r.awaited);
            if before == 0 {
                s.first = Some(now);
            }
            s.awaited |= awaited;
            s.reports.extend(batch);
            let full = s.wake_len > 0 && before < s.wake_len && s.reports.len() >= s.wake_len;
            before == 0 || awaited || full
        };
        if wake {
            self.shared.notify.notify_one();
        }
        true
    }

    /// Whether the session dropped its end.
    pub fn is_closed(&self) -> bool {
        self.shared.lock().gone
    }
}

impl Drop for InboxSender {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.notify.notify_one();
    }
}

impl Inbox {
    /// When the waiting results must reach the outbox: `window` after the
    /// first arrived, or at once when a user waits for one of them or
    /// [`Inbox::wake_at`]'s count is reached. `None` while nothing waits.
    pub fn due(&self, window: Duration) -> Option<Instant> {
        let s = self.shared.lock();
        let first = s.first?;
        if s.awaited || (s.wake_len > 0 && s.reports.len() >= s.wake_len) {
            Some(first)
        } else {
            Some(first + window)
        }
    }

    /// Wake the session once `count` results wait (a full report's worth
    /// with what its outbox already holds); 0 never.
    pub fn wake_at(&self, count: usize) {
        self.shared.lock().wake_len = count;
    }

    /// Takes every waiting result and when the first arrived.
    pub fn take(&self) -> Option<(Vec<Outgoing>, Instant)> {
        let mut s = self.shared.lock();
        let first = s.first.take()?;
        s.awaited = false;
        Some((std::mem::take(&mut s.reports), first))
    }

    /// Whether the scheduler is gone and nothing waits any more.
    pub fn is_finished(&self) -> bool {
        let s = self.shared.lock();
        s.closed && s.reports.is_empty()
    }

    /// Completes when [`InboxSender::deliver`] or the scheduler's end
    /// going away asks the session to look again (at once when that
    /// happened since the last call).
    pub async fn changed(&self) {
        self.shared.notify.notified().await;
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        let mut s = self.shared.lock();
        s.gone = true;
        s.reports = Vec::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use policy::{AppKey, Protocol};

    const WINDOW: Duration = Duration::from_millis(100);

    fn report(host: &str, awaited: bool) -> Outgoing {
        let key = AppKey {
            segment: "s".into(),
            host: host.parse().expect("host"),
            protocol: Protocol::Tcp,
            port: 80,
        };
        let mut report = Outgoing::expired(key, None);
        report.awaited = awaited;
        report
    }

    /// Whether a wake-up is pending (consumes it).
    fn woken(inbox: &Inbox) -> bool {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        rt.block_on(async {
            tokio::time::timeout(Duration::from_millis(1), inbox.changed())
                .await
                .is_ok()
        })
    }

    #[test]
    fn only_the_first_result_of_a_batch_window_wakes_the_session() {
        let (tx, rx) = inbox();
        let t0 = Instant::now();
        assert_eq!(rx.due(WINDOW), None);
        assert!(tx.deliver(vec![report("a.test", false)], t0));
        assert!(woken(&rx));
        assert_eq!(rx.due(WINDOW), Some(t0 + WINDOW));
        // More results while the first waits: appended, no wake-up.
        for (i, host) in ["b.test", "c.test", "a.test"].iter().enumerate() {
            let at = t0 + Duration::from_millis(10 * (i as u64 + 1));
            assert!(tx.deliver(vec![report(host, false)], at));
        }
        assert!(!woken(&rx));
        assert_eq!(rx.due(WINDOW), Some(t0 + WINDOW));
        let (taken, first) = rx.take().expect("waiting");
        assert_eq!(first, t0);
        let hosts: Vec<String> = taken.iter().map(|r| r.key().host.to_string()).collect();
        assert_eq!(hosts, ["a.test", "b.test", "c.test", "a.test"]);
        assert_eq!(rx.due(WINDOW), None);
        assert!(rx.take().is_none());
        // The next result starts a new window and wakes the session again.
        let t1 = t0 + Duration::from_millis(150);
        assert!(tx.deliver(vec![report("d.test", false)], t1));
        assert!(woken(&rx));
        assert_eq!(rx.due(WINDOW), Some(t1 + WINDOW));
    }

    #[test]
    fn an_awaited_result_or_a_full_report_is_due_at_once() {
        let (tx, rx) = inbox();
        let t0 = Instant::now();
        rx.wake_at(3);
        assert!(tx.deliver(vec![report("a.test", false)], t0));
        assert!(woken(&rx));
        let t1 = t0 + Duration::from_millis(5);
        assert!(tx.deliver(vec![report("b.test", true)], t1));
        assert!(woken(&rx), "a user waits: wake at once");
        assert_eq!(rx.due(WINDOW), Some(t0));
        let _ = rx.take();
        // Not awaited any more once taken.
        assert!(tx.deliver(vec![report("c.test", false)], t1));
        assert!(woken(&rx));
        assert_eq!(rx.due(WINDOW), Some(t1 + WINDOW));
        assert!(tx.deliver(vec![report("d.test", false)], t1));
        assert!(!woken(&rx));
        // The third result makes a full report's worth.
        assert!(tx.deliver(vec![report("e.test", false)], t1));
        assert!(woken(&rx));
        assert_eq!(rx.due(WINDOW), Some(t1));
    }

    #[test]
    fn either_end_going_away_is_seen_by_the_other() {
        let (tx, rx) = inbox();
        assert!(tx.deliver(vec![report("a.test", false)], Instant::now()));
        drop(tx);
        assert!(woken(&rx));
        assert!(!rx.is_finished(), "a result still waits");
        let _ = rx.take();
        assert!(rx.is_finished());
        let (tx, rx) = inbox();
        drop(rx);
        assert!(tx.is_closed());
        assert!(!tx.deliver(vec![report("a.test", false)], Instant::now()));
    }
}
