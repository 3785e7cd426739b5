//! Draining connectors before maintenance. A drained connector keeps its
//! session and reports but is selected for no new access
//! (`policy::Candidate::drained`):
//!
//! - an administrator's drain (`drain_connector`, `undrain_connector`) is
//!   kept in the store, so every replica honours it: in force on this
//!   replica at once, and on every other one at its next reading of the
//!   store (`refresh_drains`: every reconcile, and on PostgreSQL at once on
//!   the change's `NOTIFY`, the bound a disable has);
//! - a connector's own drain while it shuts down (`v1::Drain`,
//!   `self_drain`) is its session's state, never stored: it ends with the
//!   session.
//!
//! `what_if` answers the question an operator asks before either: which
//! applications would lose their last healthy (Up or Unhealthy, by this
//! replica's health table), undrained connector without the given
//! connectors. A drain is refused unless forced when it would leave one.

use std::collections::BTreeSet;
use std::time::Instant;

use policy::{AppKey, HealthReporting, Protocol, Segment};
use serde::Serialize;

use crate::ground::clock::now_ms;
use crate::state::authority::Authority;
use crate::state::registry::{ConnSnaps, SelfDrain};
use crate::store::{DrainRecord, StoreError};
use crate::trust::audit::Actor;

/// Who drained a connector.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct DrainedBy {
    /// `token` (an API token, by its configured name) or `person` (a
    /// signed-in person): an administrator's drain, until `undrain`;
    /// `connector`: the connector drains itself while it shuts down, until
    /// its session ends.
    pub kind: String,
    /// The token's configured name, the person's user name, or the
    /// connector's name.
    pub name: String,
}

/// A connector's drain, as the connector list shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct DrainView {
    /// When the drain began, Unix ms.
    pub since: i64,
    /// Who drained it.
    pub by: DrainedBy,
    /// A connector's own drain: when it said it will close its session,
    /// Unix ms (null when it did not say, and for an administrator's
    /// drain).
    pub until: Option<i64>,
}

impl DrainView {
    /// The view of an administrator's drain.
    pub(crate) fn of_record(r: &DrainRecord) -> DrainView {
        DrainView {
            since: r.since_ms,
            by: DrainedBy {
                kind: r.actor_kind.clone(),
                name: r.actor.clone(),
            },
            until: None,
        }
    }

    /// The view of connector `name`'s own drain.
    pub(crate) fn of_session(name: &str, d: SelfDrain) -> DrainView {
        DrainView {
            since: d.since_ms,
            by: DrainedBy {
                kind: "connector".into(),
                name: name.to_owned(),
            },
            until: d.until_ms,
        }
    }
}

/// One application that would lose healthy, undrained connectors.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct WhatIfApplication {
    /// Its segment.
    pub segment: String,
    /// Its host; null for a segment with `health_reporting = "none"`, whose
    /// applications every connected connector of its groups carries alike
    /// (the row stands for all of them).
    pub host: Option<String>,
    /// Its protocol (null with `host`).
    #[schema(schema_with = crate::ground::schema::nullable_protocol)]
    pub protocol: Option<Protocol>,
    /// Its port (null with `host`).
    pub port: Option<u16>,
    /// The segment's health reporting mode.
    #[schema(schema_with = crate::ground::schema::health_reporting)]
    pub health_reporting: HealthReporting,
    /// The connectors taken away that carry it now (healthy, undrained),
    /// by name.
    pub losing: Vec<String>,
    /// The healthy, undrained connectors it keeps, by name.
    pub left: Vec<String>,
    /// True when none is left: every access to it would be refused.
    pub stranded: bool,
}

/// What taking connectors away would do (`GET /api/v1/whatif`, and a
/// refused drain's answer).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct WhatIfView {
    /// The connectors taken away: those named, and every connector of a
    /// named group that this replica knows, by name.
    pub without: Vec<String>,
    /// How many applications would be left without a healthy, undrained
    /// connector (listed or not).
    pub stranded: usize,
    /// Of those, how many belong to segments with
    /// `client_hostname_validation = true`, which only callers with the
    /// `admin` scope see listed.
    pub hidden_stranded: usize,
    /// Every application that would lose a healthy, undrained connector:
    /// the stranded first, then by segment, host, protocol and port.
    pub applications: Vec<WhatIfApplication>,
}

/// Why `--without` names could not be taken.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum WithoutError {
    /// A name is malformed, or there is none.
    #[error("without: {0}")]
    Invalid(String),
    /// Neither a connector this CA knows nor a connector group.
    #[error("no connector or connector group {0:?}")]
    Unknown(String),
    /// Both a connector and a connector group.
    #[error("{0:?} names both a connector and a connector group: say connector:{0} or group:{0}")]
    Ambiguous(String),
}

/// What `drain_connector` did.
#[derive(Debug)]
pub enum DrainAnswer {
    /// No connector of that name is enrolled or known here.
    NotFound,
    /// Not drained: it would leave applications without a healthy,
    /// undrained connector (and the drain was not forced).
    Refused(WhatIfView),
    /// Drained (or already was: the earlier drain stands).
    Drained {
        /// The drain in force.
        record: DrainRecord,
        /// Whether it was drained before this request.
        already: bool,
        /// What the drain takes away (stranded applications, when forced).
        whatif: WhatIfView,
    },
}

/// Most names one `without` takes.
const MAX_WITHOUT_NAMES: usize = 100;

/// Reads the administrators' drains from the store into the registry
/// (wakes waiting decisions when they changed).
pub fn refresh_drains(authority: &Authority) -> Result<(), StoreError> {
    let drains = authority.store().drains()?;
    if authority.registry().set_drains(drains) {
        authority.bump();
    }
    Ok(())
}

/// Whether `name` is a connector this CA knows: one this replica has
/// seen, or one enrolled in the store.
fn knows_connector(authority: &Authority, name: &str) -> Result<bool, StoreError> {
    if authority.registry().knows(name) {
        return Ok(true);
    }
    Ok(authority
        .store()
        .connectors()?
        .iter()
        .any(|c| c.name == name))
}

/// Drains connector `name` for `actor` unless that leaves an
/// application without a healthy, undrained connector and `force` is
/// false. In force here at once; every replica reads it from the store.
pub fn drain_connector(
    authority: &Authority,
    name: &str,
    actor: &Actor,
    force: bool,
) -> Result<DrainAnswer, StoreError> {
    if !knows_connector(authority, name)? {
        return Ok(DrainAnswer::NotFound);
    }
    let already = authority.registry().drains().get(name).cloned();
    let whatif = what_if(authority, &BTreeSet::from([name.to_owned()]), true);
    if whatif.stranded > 0 && !force && already.is_none() {
        return Ok(DrainAnswer::Refused(whatif));
    }
    let record = authority.store().drain(&DrainRecord {
        connector: name.to_owned(),
        since_ms: now_ms(),
        actor_kind: actor.kind.as_str().to_owned(),
        actor: actor.name.clone(),
    })?;
    authority.registry().drained(record.clone());
    authority.bump();
    tracing::info!(
        connector = name,
        stranded = whatif.stranded,
        "connector drained: selected for no new access"
    );
    Ok(DrainAnswer::Drained {
        already: already.is_some(),
        record,
        whatif,
    })
}

/// Ends an administrator's drain of `name`: `None` when no such
/// connector is known, else whether it was drained.
pub fn undrain_connector(authority: &Authority, name: &str) -> Result<Option<bool>, StoreError> {
    let was = authority.store().undrain(name)?;
    if !was && !knows_connector(authority, name)? {
        return Ok(None);
    }
    authority.registry().undrained(name);
    authority.bump();
    if was {
        tracing::info!(connector = name, "connector undrained");
    }
    Ok(Some(was))
}

/// Connector `name`'s live session drains itself (`v1::Drain`): it is
/// selected for no new access until that session ends.
pub(crate) fn self_drain(authority: &Authority, name: &str, drain_ms: u64) {
    let since_ms = now_ms();
    let until_ms = (drain_ms > 0)
        .then(|| since_ms.saturating_add(i64::try_from(drain_ms).unwrap_or(i64::MAX)));
    if authority
        .registry()
        .self_drain(name, SelfDrain { since_ms, until_ms })
    {
        authority.bump();
        tracing::info!(
            connector = name,
            drain_ms,
            "connector drains itself before it stops: selected for no new access"
        );
    }
}

/// The connectors `spec` names (comma-separated connector or group
/// names, each optionally `connector:` or `group:`): a group stands
/// for every connector of it this replica knows.
pub fn resolve_without(
    authority: &Authority,
    spec: &str,
) -> Result<Result<BTreeSet<String>, WithoutError>, StoreError> {
    let names: Vec<&str> = spec.split(',').map(str::trim).collect();
    if names.iter().all(|n| n.is_empty()) {
        return Ok(Err(WithoutError::Invalid(
            "name a connector or connector group".into(),
        )));
    }
    if names.len() > MAX_WITHOUT_NAMES {
        return Ok(Err(WithoutError::Invalid(format!(
            "{} names (at most {MAX_WITHOUT_NAMES})",
            names.len()
        ))));
    }
    let state = authority.snapshot();
    let mut out = BTreeSet::new();
    for raw in names.into_iter().filter(|n| !n.is_empty()) {
        let (kind, name) = match raw.split_once(':') {
            Some((kind @ ("connector" | "group"), name)) => (Some(kind), name),
            Some(_) => {
                return Ok(Err(WithoutError::Invalid(format!(
                    "{:?}: a prefix is connector: or group:",
                    raw.chars().take(140).collect::<String>()
                ))));
            }
            None => (None, raw),
        };
        if let Err(e) = crate::credentials::auth::check_connector_name(name) {
            return Ok(Err(WithoutError::Invalid(format!(
                "{:?}: {e}",
                name.chars().take(140).collect::<String>()
            ))));
        }
        let group = kind != Some("connector") && state.policy().has_group(name);
        let connector = kind != Some("group") && knows_connector(authority, name)?;
        match (connector, group) {
            (true, true) => return Ok(Err(WithoutError::Ambiguous(name.to_owned()))),
            (true, false) => {
                out.insert(name.to_owned());
            }
            (false, true) => {
                out.extend(authority.registry().members(name).into_iter().map(|m| m.0))
            }
            (false, false) => return Ok(Err(WithoutError::Unknown(name.to_owned()))),
        }
    }
    Ok(Ok(out))
}

/// Which applications would lose healthy, undrained connectors if
/// `without` were gone, by this replica's health table (and, for
/// `none` segments, its connected connectors). Applications of hidden
/// segments (`client_hostname_validation`) are listed only when
/// `show_hidden`; they are counted either way.
pub fn what_if(authority: &Authority, without: &BTreeSet<String>, show_hidden: bool) -> WhatIfView {
    let state = authority.snapshot();
    let conns = authority.registry().snapshot();
    let now = Instant::now();
    let mut rows = Vec::new();
    for key in authority.health().keys() {
        let Some(segment) = state.policy().segment(&key.segment) else {
            continue;
        };
        let healthy = healthy(authority, &state, segment, &key, &conns, now);
        rows.extend(row(segment, Some(&key), healthy, without));
    }
    for segment in &state.policy().segments {
        if segment.health_reporting == HealthReporting::None {
            let healthy = conns
                .iter()
                .filter(|(_, c)| c.connected && !c.drained && segment.served_by(&c.group))
                .map(|(name, _)| name.clone())
                .collect();
            rows.extend(row(segment, None, healthy, without));
        }
    }
    let hidden = |r: &WhatIfApplication| {
        state
            .policy()
            .segment(&r.segment)
            .is_some_and(|s| s.client_hostname_validation)
    };
    let stranded = rows.iter().filter(|r| r.stranded).count();
    let hidden_stranded = rows.iter().filter(|r| r.stranded && hidden(r)).count();
    if !show_hidden {
        rows.retain(|r| !hidden(r));
    }
    rows.sort_by(|a, b| {
        (!a.stranded, &a.segment, &a.host, a.protocol, a.port).cmp(&(
            !b.stranded,
            &b.segment,
            &b.host,
            b.protocol,
            b.port,
        ))
    });
    WhatIfView {
        without: without.iter().cloned().collect(),
        stranded,
        hidden_stranded: if show_hidden { 0 } else { hidden_stranded },
        applications: rows,
    }
}

/// The connectors that carry `key` of `segment` now: connected,
/// undrained, of its groups, with a reachable effective status.
fn healthy(
    authority: &Authority,
    state: &crate::state::policy_state::PolicyState,
    segment: &Segment,
    key: &AppKey,
    conns: &ConnSnaps,
    now: Instant,
) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (name, status, checked) in authority.health().statuses(key) {
        let Some(c) = conns.get(&name) else {
            continue;
        };
        if !c.connected || c.drained || !segment.served_by(&c.group) {
            continue;
        }
        let live = segment.health_reporting != HealthReporting::OnAccess
            || authority.on_access().is_live(key, &name, now);
        let age = now.saturating_duration_since(checked);
        let (effective, _) =
            Authority::effective(state, segment, status, age, Some(c.link()), live);
        if effective.is_reachable() {
            out.insert(name);
        }
    }
    out
}

/// The row of an application (`key`; `None`: every application of a `none`
/// segment) carried by `healthy`, when `without` takes one of them.
fn row(
    segment: &Segment,
    key: Option<&AppKey>,
    healthy: BTreeSet<String>,
    without: &BTreeSet<String>,
) -> Option<WhatIfApplication> {
    let (losing, left): (Vec<String>, Vec<String>) =
        healthy.into_iter().partition(|c| without.contains(c));
    if losing.is_empty() {
        return None;
    }
    Some(WhatIfApplication {
        segment: segment.name.clone(),
        host: key.map(|k| k.host.to_string()),
        protocol: key.map(|k| k.protocol),
        port: key.map(|k| k.port),
        health_reporting: segment.health_reporting,
        stranded: left.is_empty(),
        losing,
        left,
    })
}

/// The stranded applications of `whatif` as one line each
/// (`segment: host:port/protocol`, or `segment: every application`), for a
/// refusal's message.
pub fn stranded_lines(whatif: &WhatIfView) -> Vec<String> {
    let mut lines: Vec<String> = whatif
        .applications
        .iter()
        .filter(|a| a.stranded)
        .map(|a| match (&a.host, a.port, a.protocol) {
            (Some(h), Some(p), Some(proto)) => format!("{}: {h}:{p}/{proto}", a.segment),
            _ => format!("{}: every application (health_reporting = none)", a.segment),
        })
        .collect();
    if whatif.hidden_stranded > 0 {
        lines.push(format!(
            "{} of segments with client_hostname_validation",
            whatif.hidden_stranded
        ));
    }
    lines
}
