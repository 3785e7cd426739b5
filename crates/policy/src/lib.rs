//! reach's pure domain logic: the policy model, its validation, check
//! planning and policy dry-runs, application status, request matching,
//! connector selection (with the user→group distance `location` measures) and on-access window bookkeeping.
//!
//! **Invariant:** this crate does no I/O and depends on neither tokio nor
//! tonic. It never reads a clock (time comes in as an argument) and draws
//! randomness only from an `Rng` its caller passes in, so every rule here is
//! unit-testable and deterministic.

#![forbid(unsafe_code)]

pub mod check;
pub mod damping;
pub mod dryrun;
pub mod host;
pub mod location;
pub mod matching;
pub mod model;
pub mod plan;
pub mod report;
pub mod roster;
pub mod select;
pub mod status;
pub mod validate;
pub mod window;

pub use check::{AppCheck, CheckDetail, CheckKind, StatusRanges};
pub use damping::{Damper, Damping};
pub use dryrun::{
    DnsResolutionChange, GroupChange, GroupDiff, GroupPlan, LocationChange, PlanParams, PolicyPlan,
    SegmentChange, SegmentPlan, diff_policies, plan_policy,
};
pub use host::{Host, HostError, HostRef};
pub use location::{
    EARTH_RADIUS_KM, KM_PER_RTT_MS, Location, LocationError, LocationSpec, estimated_rtt,
};
pub use matching::{Match, MatchOutcome, Request, SegmentIndex};
pub use model::{
    AppEntry, AppKey, ConnectorGroup, DnsResolution, HealthReporting, Policy, PortRange, Protocol,
    Segment, Strategy, closest, did_you_mean,
};
pub use plan::{
    BudgetEstimate, CheckTarget, DEFAULT_CHECKS_PER_SECOND, cycle_time, effective_rate,
    estimate_budget, estimated_checks, plan_checks,
};
pub use report::ApplicationReport;
pub use roster::{Roster, RosterCounts};
pub use select::{
    Candidate, CandidateNote, Decision, EXPLAINED_CANDIDATES, Eligibility, Explanation,
    LocationUse, Proximity, RTT_WEIGHT, RefusalReason, Tolerance, UserLocationNote, Verdict,
    explain, explain_owned, explain_with, rtt_sample, select, select_with, smooth_rtt,
};
pub use status::{
    AddressResult, Failure, FailureKind, Method, Status, application_status, effective_status,
    stale_limit,
};
pub use validate::{
    DEFAULT_MIN_SUBNET_PREFIX_V4, DEFAULT_MIN_SUBNET_PREFIX_V6, GroupSpec, Limits, PolicySpec,
    PortSpec, SegmentSpec, Subject, ValidationError, ValidationErrors, parse_entry, validate,
    validate_segment, validate_with,
};
pub use window::{AccessWindows, Coalescer, Renewal};
