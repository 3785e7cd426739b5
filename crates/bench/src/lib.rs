//! reach's benchmark system: every hot path's figure measured next to its
//! bare baseline (the same work done by the underlying crate alone), in the
//! same run on the same machine, and reported as a ratio.
//!
//! - [`report`]: the figure model, `results.json`, the printed table.
//! - [`sys`]: CPU time and RSS of a process from `/proc`, the machine.
//! - [`servers`]: child processes the driver measures (the CA, bare tonic
//!   and axum servers), so their RSS and CPU are their own.
//! - [`sim`]: simulated connectors speaking the proto.
//! - [`pg`]: a PostgreSQL server of the run's own and its statistics.
//! - [`figures`]: one module per group of figures.
//!
//! All traffic goes to loopback (127.0.0.0/8) only.

#![forbid(unsafe_code)]

pub mod figures;
pub mod pg;
pub mod report;
pub mod servers;
pub mod sim;
pub mod stats;
pub mod sys;

/// How long the measurements run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// CI smoke mode: every figure runs for a fraction of a second, on small
    /// sizes, so that it is known to work; its numbers mean little.
    Quick,
    /// The published numbers.
    Full,
}

impl Mode {
    /// `quick` or `full`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Quick => "quick",
            Mode::Full => "full",
        }
    }

    /// Picks the quick or the full value.
    pub fn pick<T>(self, quick: T, full: T) -> T {
        match self {
            Mode::Quick => quick,
            Mode::Full => full,
        }
    }
}
