//! The audit trail of admin actions: who (an [`Actor`]: an API token by its
//! configured name, a signed-in person, or the CA itself for a
//! configuration reload), from which address, did what to what, and how it
//! ended. Each action is one structured log line (tracing target `audit`)
//! and one row in the store, so every replica reads the same trail
//! (`GET /api/v1/audit`); rows older than `[audit] retention_s` are pruned
//! by housekeeping.

use std::net::IpAddr;

use serde::Serialize;

use crate::ground::clock::now_ms;
use crate::state::authority::Authority;
use crate::store::{AuditFilter, AuditRecord, StoreError};

/// What kind of identity acted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActorKind {
    /// An API token, named by its `[[api_tokens]] name`.
    Token,
    /// A signed-in person (by their user name).
    Person,
    /// The CA itself (a configuration reload on SIGHUP or a file change).
    System,
    /// Nobody known: a request with an unknown or throttled token, or a
    /// sign-in that failed before the provider named the person.
    Unknown,
}

impl ActorKind {
    /// The stored and shown name.
    pub fn as_str(self) -> &'static str {
        match self {
            ActorKind::Token => "token",
            ActorKind::Person => "person",
            ActorKind::System => "system",
            ActorKind::Unknown => "unknown",
        }
    }
}

/// Who acted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Actor {
    /// What kind of identity.
    pub kind: ActorKind,
    /// Its name (a token's configured name, never the token; a person's
    /// `preferred_username` as their provider gave it).
    pub name: String,
    /// A person's provider (`[[oidc]] name`); empty for the others.
    pub provider: String,
    /// A person's subject (`sub`) at that provider, which, unlike the
    /// name, no other account there or at another provider shares.
    pub subject: String,
}

impl Actor {
    /// An API token by its configured name.
    pub fn token(name: impl Into<String>) -> Actor {
        Actor::named(ActorKind::Token, name.into())
    }

    /// A signed-in person: their user name, provider and subject.
    pub fn person(
        name: impl Into<String>,
        provider: impl Into<String>,
        subject: impl Into<String>,
    ) -> Actor {
        Actor {
            kind: ActorKind::Person,
            name: name.into(),
            provider: provider.into(),
            subject: subject.into(),
        }
    }

    /// The CA itself, acting on `trigger` (`SIGHUP`, `file change`).
    pub fn system(trigger: impl Into<String>) -> Actor {
        Actor::named(ActorKind::System, trigger.into())
    }

    /// Nobody known (`what`: how they tried, e.g. `unknown token`).
    pub fn unknown(what: impl Into<String>) -> Actor {
        Actor::named(ActorKind::Unknown, what.into())
    }

    fn named(kind: ActorKind, name: String) -> Actor {
        Actor {
            kind,
            name,
            provider: String::new(),
            subject: String::new(),
        }
    }
}

/// How an admin action ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done.
    Ok,
    /// Its target does not exist; nothing changed.
    NotFound,
    /// Not allowed (a token without the `admin` scope; a configuration
    /// the CA refused); nothing changed.
    Refused,
    /// The CA failed (its database); it may not have happened.
    Failed,
}

impl Outcome {
    /// The stored and shown name.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::NotFound => "not_found",
            Outcome::Refused => "refused",
            Outcome::Failed => "failed",
        }
    }
}

/// One admin action, to record.
#[derive(Clone, Debug)]
pub struct AdminAction<'a> {
    /// Who.
    pub actor: &'a Actor,
    /// From where (`None`: not over the network).
    pub source: Option<IpAddr>,
    /// What: `connector.disable`, `connector.enable`, `connector.revoke`,
    /// `connector.allow-reenroll`, `connector.drain`, `connector.undrain`,
    /// `connector.delete`,
    /// `provisioning_key.revoke`, `config.reload`, `audit.read`,
    /// `session.sign_in`, `session.sign_out`.
    pub action: &'a str,
    /// On what: a connector name, a connector group, the config file.
    pub target: &'a str,
    /// How it ended.
    pub outcome: Outcome,
    /// More on the outcome (the answer's fields, the refusal's reason).
    pub detail: String,
}

/// Longest target and detail kept (a name from a URL is the caller's).
const MAX_TEXT: usize = 1024;

fn bounded(s: &str) -> String {
    s.chars().take(MAX_TEXT).collect()
}

impl AdminAction<'_> {
    /// The row the store keeps, at `at_ms`.
    pub fn record(&self, at_ms: i64) -> AuditRecord {
        AuditRecord {
            at_ms,
            actor_kind: self.actor.kind.as_str().to_owned(),
            actor: self.actor.name.clone(),
            source: self.source.map(|ip| ip.to_string()).unwrap_or_default(),
            action: self.action.to_owned(),
            target: bounded(self.target),
            outcome: self.outcome.as_str().to_owned(),
            detail: bounded(&self.detail),
            provider: self.actor.provider.clone(),
            subject: bounded(&self.actor.subject),
        }
    }
}

/// Who acted, as `GET /api/v1/audit` shows it.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct ActorView {
    /// `token` (an API token by its configured name), `person` (a
    /// signed-in person), `system` (the CA itself: a configuration
    /// reload) or `unknown` (an unknown or throttled token; a sign-in
    /// refused before the provider named the person).
    pub kind: String,
    /// The token's configured name, the person's user name (their
    /// provider's `preferred_username`, else email, else subject), or what
    /// triggered the CA (`SIGHUP`, `file change`), or how an unknown
    /// caller tried (`unknown`).
    pub name: String,
    /// A person's OpenID provider (`[[oidc]] name`); absent for others.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// A person's subject (`sub`) at that provider: who they are, where
    /// `name` may be shared by accounts of two providers; absent for
    /// others.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
}

/// One audit entry as `GET /api/v1/audit` shows it.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct AuditEntryView {
    /// When, Unix ms.
    pub at: i64,
    /// Who.
    pub actor: ActorView,
    /// The address the request came from; `null` when not over the network.
    pub source: Option<String>,
    /// What was done: `connector.disable`, `connector.enable`,
    /// `connector.revoke`, `connector.allow-reenroll`, `connector.drain`,
    /// `connector.undrain`, `connector.delete`,
    /// `provisioning_key.revoke`, `config.reload` (the detail names the
    /// API tokens, connector groups and segments it added or removed),
    /// `audit.read` (a read of this trail; the detail is its query),
    /// `session.sign_in` (also refused ones), `session.sign_out`,
    /// `token.refused` (admin requests with an unknown, malformed or
    /// throttled token: one entry per source and minute, detail
    /// `refusals: N`).
    pub action: String,
    /// What it was done to: a connector, a connector group, the config file.
    pub target: String,
    /// `ok`, `not_found` (no such target; nothing changed), `refused` (not
    /// allowed, or a configuration the CA refused; nothing changed) or
    /// `failed` (the CA's database failed).
    pub outcome: String,
    /// More on the outcome: the answer's fields, or why it was refused.
    pub detail: String,
}

impl From<AuditRecord> for AuditEntryView {
    fn from(r: AuditRecord) -> Self {
        AuditEntryView {
            at: r.at_ms,
            actor: ActorView {
                kind: r.actor_kind,
                name: r.actor,
                provider: (!r.provider.is_empty()).then_some(r.provider),
                subject: (!r.subject.is_empty()).then_some(r.subject),
            },
            source: (!r.source.is_empty()).then_some(r.source),
            action: r.action,
            target: r.target,
            outcome: r.outcome,
            detail: r.detail,
        }
    }
}

/// One page of the audit trail (`GET /api/v1/audit`).
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct AuditPage {
    /// The entries, newest first.
    pub entries: Vec<AuditEntryView>,
    /// How many match in all.
    pub total: u64,
    /// The page shown, from 1.
    pub page: u64,
    /// Entries per page.
    pub per_page: u32,
    /// Number of pages (at least 1).
    pub pages: u64,
}

/// Records `action` now: one log line (target `audit`) and a row in the
/// store. A store that cannot write the row is an error the caller
/// answers with (an admin action, a sign-in or a read of the trail
/// is then answered as failed): the trail has no silent gaps.
pub fn record(authority: &Authority, action: &AdminAction<'_>) -> Result<(), StoreError> {
    let r = action.record(now_ms());
    tracing::info!(
        target: "audit",
        actor_kind = %r.actor_kind,
        actor = %r.actor,
        provider = %r.provider,
        subject = %r.subject,
        source = %r.source,
        action = %r.action,
        target = %r.target,
        outcome = %r.outcome,
        detail = %r.detail,
        "admin action"
    );
    emit_audit(authority, &r);
    authority.store().record_audit(&r).inspect_err(|e| {
        tracing::error!(error = %e, action = %r.action, outcome = %r.outcome, "audit trail: recording failed; the action is answered as failed");
    })
}

/// The action to the log receivers that take audit records.
fn emit_audit(authority: &Authority, r: &AuditRecord) {
    use crate::logstream::{Field, Kind, Record};
    let stream = authority.log_stream();
    if !stream.wants(Kind::Audit) {
        return;
    }
    let actor = if r.provider.is_empty() {
        format!("{} {}", r.actor_kind, r.actor)
    } else {
        format!("{} {} ({})", r.actor_kind, r.actor, r.provider)
    };
    stream.emit(
        Record::new(Kind::Audit, u64::try_from(r.at_ms).unwrap_or(0))
            .text(Field::Actor, actor)
            .text(Field::Action, r.action.as_str())
            .text(Field::Target, r.target.as_str())
            .text(Field::Outcome, r.outcome.as_str())
            .text(Field::Source, r.source.as_str())
            .text(Field::Detail, r.detail.as_str()),
    );
}

/// One page (from 1) of the audit trail matching `filter`.
pub fn page(
    authority: &Authority,
    filter: &AuditFilter,
    page: u64,
    per_page: u32,
) -> Result<AuditPage, StoreError> {
    let offset = page.saturating_sub(1).saturating_mul(u64::from(per_page));
    let (records, total) = authority.store().audit(filter, per_page, offset)?;
    Ok(AuditPage {
        entries: records.into_iter().map(AuditEntryView::from).collect(),
        total,
        page,
        per_page,
        pages: total.div_ceil(u64::from(per_page)).max(1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer into a shared buffer, for the log line.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("buffer").extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// One action is one log line with target `audit` and every field, and
    /// one stored row.
    #[test]
    fn an_action_is_one_audit_log_line_and_one_row() {
        let config = crate::Config::from_toml(
            "[server]\nallow_short_secrets = true\n",
            std::path::Path::new("."),
        )
        .expect("valid");
        let a = Authority::with_trust(config, None, crate::store::Store::in_memory().expect("db"));
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let root = Actor::token("root");
        tracing::subscriber::with_default(subscriber, || {
            record(
                &a,
                &AdminAction {
                    actor: &root,
                    source: Some(std::net::Ipv4Addr::new(192, 0, 2, 7).into()),
                    action: "connector.revoke",
                    target: "c1",
                    outcome: Outcome::NotFound,
                    detail: "x".repeat(2000),
                },
            )
            .expect("recorded");
        });
        let text = String::from_utf8(captured.0.lock().expect("buffer").clone()).expect("utf-8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "{text}");
        for part in [
            " audit: admin action",
            "actor_kind=token",
            "actor=root",
            "source=192.0.2.7",
            "action=connector.revoke",
            "target=c1",
            "outcome=not_found",
        ] {
            assert!(lines[0].contains(part), "{part}: {text}");
        }
        let (rows, _) = a
            .store()
            .audit(&AuditFilter::default(), 10, 0)
            .expect("read");
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].detail.len(), MAX_TEXT, "bounded");
        let view = AuditEntryView::from(rows[0].clone());
        assert_eq!(
            (view.actor.kind.as_str(), view.source.as_deref()),
            ("token", Some("192.0.2.7"))
        );
    }
}
