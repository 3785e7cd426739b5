//! One-time tickets that open the change stream from a browser, and the
//! lock that holds them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::ground::sync::lock;

/// How long a stream ticket may wait before it is used.
pub const TICKET_TTL: Duration = Duration::from_secs(30);
/// Most unused tickets held at once (each a few dozen bytes); past it, new
/// ones are refused until old ones are used or expire.
pub const MAX_TICKETS: usize = 10_000;

/// One-time tickets that open the change stream
/// (`GET /api/v1/health/stream?ticket=`). A browser's `EventSource` cannot
/// send `Authorization`, so the page trades its read token for a ticket
/// (`POST /api/v1/health/stream/ticket`) and puts that in the URL. A
/// ticket is 256 random bits, good for one stream opened within
/// [`TICKET_TTL`]: a URL that leaks into a log or a history is useless
/// by the time anyone reads it, and it never grants more than the stream.
/// Only SHA-256 digests of tickets are kept, so the lookup's timing says
/// nothing about a ticket. Time comes in as an argument.
#[derive(Debug, Default)]
pub struct StreamTickets {
    issued: Mutex<HashMap<String, Instant>>,
}

/// Why no ticket was issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("too many unused stream tickets ({MAX_TICKETS}); retry in a few seconds")]
pub struct TooManyTickets;

impl StreamTickets {
    /// A new ticket, valid until `now + TICKET_TTL`.
    pub fn issue(&self, now: Instant) -> Result<String, TooManyTickets> {
        let mut issued = lock(&self.issued);
        // Expired tickets are dropped when the cap is reached (the map
        // stays bounded either way).
        if issued.len() >= MAX_TICKETS {
            issued.retain(|_, until| *until > now);
        }
        if issued.len() >= MAX_TICKETS {
            return Err(TooManyTickets);
        }
        let bytes: [u8; 32] = rand::random();
        let ticket: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        issued.insert(
            crate::ground::digest::sha256_hex(ticket.as_bytes()),
            now + TICKET_TTL,
        );
        Ok(ticket)
    }

    /// Whether `ticket` was issued, is unused and unexpired at `now`; it is
    /// used up either way.
    pub fn redeem(&self, ticket: &str, now: Instant) -> bool {
        let digest = crate::ground::digest::sha256_hex(ticket.as_bytes());
        lock(&self.issued)
            .remove(&digest)
            .is_some_and(|until| until > now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_tickets_are_single_use_and_expire() {
        let tickets = StreamTickets::default();
        let t0 = Instant::now();
        let a = tickets.issue(t0).expect("issued");
        let b = tickets.issue(t0).expect("issued");
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
        assert!(!tickets.redeem("not-a-ticket", t0));
        assert!(tickets.redeem(&a, t0 + Duration::from_secs(1)));
        assert!(
            !tickets.redeem(&a, t0 + Duration::from_secs(1)),
            "used twice"
        );
        assert!(!tickets.redeem(&b, t0 + TICKET_TTL), "expired");
    }

    #[test]
    fn stream_tickets_are_capped_until_they_expire() {
        let tickets = StreamTickets::default();
        let t0 = Instant::now();
        for _ in 0..MAX_TICKETS {
            tickets.issue(t0).expect("under the cap");
        }
        assert_eq!(tickets.issue(t0), Err(TooManyTickets));
        assert!(
            tickets.issue(t0 + TICKET_TTL).is_ok(),
            "expired ones free room"
        );
    }
}
