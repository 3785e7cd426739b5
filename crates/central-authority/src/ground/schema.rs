//! Schemas of the policy's enums and other shared pieces of the OpenAPI
//! document, used by the views' and bodies' `schema_with` and by
//! `openapi`. Each enum's names come from serde, guarded by an exhaustive
//! `match` so a new variant does not compile until it is documented.

use policy::{FailureKind, HealthReporting, Method, Protocol, RefusalReason, Status, Strategy};
use serde::Serialize;
use serde_json::Value;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ArrayBuilder, Object, ObjectBuilder, Schema, SchemaType, Type};

/// Fails to compile when policy gains a variant the lists here miss.
#[allow(dead_code)]
pub(crate) fn exhaustive(
    r: RefusalReason,
    s: Status,
    m: Method,
    f: FailureKind,
    h: HealthReporting,
    st: Strategy,
) {
    match st {
        Strategy::Healthy | Strategy::Group | Strategy::Nearest => {}
    }
    match r {
        RefusalReason::NoSegment
        | RefusalReason::PortNotInSegment
        | RefusalReason::NoConnector
        | RefusalReason::AllDown
        | RefusalReason::NoHealthReport
        | RefusalReason::DiscoveryTimeout
        | RefusalReason::AllDrained => {}
    }
    match s {
        Status::Up | Status::Unhealthy | Status::Down | Status::Unknown => {}
    }
    match m {
        Method::Tcp | Method::Icmp | Method::TcpFallback => {}
    }
    match f {
        FailureKind::Timeout
        | FailureKind::Refused
        | FailureKind::Unreachable
        | FailureKind::Dns
        | FailureKind::Other
        | FailureKind::NotAllowed => {}
    }
    match h {
        HealthReporting::Continuous | HealthReporting::OnAccess | HealthReporting::None => {}
    }
}

/// The names values serialize to (serde is the source of truth).
pub(crate) fn names<T: Serialize>(values: &[T]) -> Vec<String> {
    values
        .iter()
        .filter_map(|v| match serde_json::to_value(v) {
            Ok(Value::String(s)) => Some(s),
            _ => None,
        })
        .collect()
}

pub(crate) fn string_enum(values: Vec<String>, description: &str, nullable: bool) -> Object {
    let mut values: Vec<Value> = values.into_iter().map(Value::String).collect();
    let kind: SchemaType = if nullable {
        values.push(Value::Null);
        [Type::String, Type::Null].into_iter().collect()
    } else {
        Type::String.into()
    };
    ObjectBuilder::new()
        .schema_type(kind)
        .enum_values(Some(values))
        .description(Some(description))
        .build()
}

/// An application's or connector's status.
pub fn status() -> Object {
    string_enum(
        names(&[Status::Up, Status::Unhealthy, Status::Down, Status::Unknown]),
        "`up` (every address reachable), `unhealthy` (some), `down` (none, or DNS failed), \
         `unknown` (no current result)",
        false,
    )
}

/// One address's status (up or down).
pub fn address_status() -> Object {
    string_enum(
        names(&[Status::Up, Status::Down]),
        "whether this address answered",
        false,
    )
}

/// Why a status changed.
pub fn transition_cause() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some(
            "`report` (a connector's report) or the cause of an unknown status \
             (`disconnected`, `stale`, `window_expired`, `not_in_full_state`, `reported`)",
        ))
        .build()
}

/// The check method.
pub fn method() -> Object {
    string_enum(
        names(&[Method::Tcp, Method::Icmp, Method::TcpFallback]),
        "`tcp` handshake, `icmp` echo, or `tcp_fallback` after ICMP failed (UDP ports)",
        false,
    )
}

/// A failure's kind.
pub fn failure() -> Object {
    string_enum(
        names(&[
            FailureKind::Timeout,
            FailureKind::Refused,
            FailureKind::Unreachable,
            FailureKind::Dns,
            FailureKind::Other,
            FailureKind::NotAllowed,
        ]),
        "the failure's kind (null when the check succeeded)",
        true,
    )
}

/// An access request's host: a DNS name by `policy::Host`'s rules (labels
/// of letters, digits, `-` and `_`, not starting or ending with `-`, at most
/// 63 bytes; at most 253 bytes), an IPv4 or an IPv6 address.
pub fn request_host() -> RefOr<Schema> {
    const LABEL: &str = "[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?";
    utoipa::openapi::schema::OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(format!(r"^{LABEL}(\.{LABEL})*\.?$")))
                .max_length(Some(253))
                .description(Some("a DNS name or an IPv4 address")),
        )
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .format(Some(utoipa::openapi::SchemaFormat::Custom("ipv6".into())))
                .description(Some("an IPv6 address")),
        )
        .description(Some("the host the user asked for"))
        .examples(["jira.lanukcorp.com", "10.1.1.1"])
        .into()
}

/// A transport protocol.
pub fn protocol() -> Object {
    string_enum(
        names(&[Protocol::Tcp, Protocol::Udp]),
        "transport protocol",
        false,
    )
}

/// A transport protocol, or null.
pub fn nullable_protocol() -> Object {
    string_enum(
        names(&[Protocol::Tcp, Protocol::Udp]),
        "transport protocol (null: see the object's description)",
        true,
    )
}

/// A segment's health reporting mode.
pub fn health_reporting() -> Object {
    string_enum(
        names(&[
            HealthReporting::Continuous,
            HealthReporting::OnAccess,
            HealthReporting::None,
        ]),
        "the segment's health reporting mode",
        false,
    )
}

pub(crate) fn strategy() -> Object {
    string_enum(
        names(&[Strategy::Healthy, Strategy::Group, Strategy::Nearest]),
        "the selection strategy in force",
        false,
    )
}

/// A certificate's state.
pub fn certificate_state() -> Object {
    string_enum(
        ["current", "grace", "revoked", "expired"]
            .map(String::from)
            .to_vec(),
        "`current` (the newest valid one), `grace` (superseded by a renewal, accepted until \
         `grace_until`), `revoked` or `expired`",
        false,
    )
}

pub(crate) fn strings(description: &str) -> ArrayBuilder {
    ArrayBuilder::new()
        .items(ObjectBuilder::new().schema_type(Type::String))
        .description(Some(description))
}

/// A count (an integer, at least 0).
pub(crate) fn count(description: &str) -> Object {
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .minimum(Some(0))
        .description(Some(description))
        .build()
}

pub(crate) fn nullable_number(description: &str) -> Object {
    ObjectBuilder::new()
        .schema_type(
            [Type::Number, Type::Null]
                .into_iter()
                .collect::<SchemaType>(),
        )
        .description(Some(description))
        .build()
}

/// The user's location in an explanation (`policy::UserLocationNote`),
/// null when the request named none.
pub(crate) fn user_location_note() -> Object {
    let number = |d: &str| {
        ObjectBuilder::new()
            .schema_type(Type::Number)
            .description(Some(d))
    };
    ObjectBuilder::new()
        .schema_type(
            [Type::Object, Type::Null]
                .into_iter()
                .collect::<SchemaType>(),
        )
        .description(Some(
            "the request's `user_location` and whether `nearest` counted it (null when the \
             request named none)",
        ))
        .property("latitude", number("degrees north"))
        .property("longitude", number("degrees east"))
        .property(
            "used",
            ObjectBuilder::new()
                .schema_type(Type::Boolean)
                .description(Some("whether each candidate's score includes its user RTT")),
        )
        .property(
            "reason",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .description(Some(
                    "why (not): e.g. a reachable candidate's group has no location",
                )),
        )
        .required("latitude")
        .required("longitude")
        .required("used")
        .required("reason")
        .build()
}

pub(crate) fn nullable_string(description: &str) -> Object {
    ObjectBuilder::new()
        .schema_type(
            [Type::String, Type::Null]
                .into_iter()
                .collect::<SchemaType>(),
        )
        .description(Some(description))
        .build()
}
