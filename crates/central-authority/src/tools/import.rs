//! `central-authority import`: turns application segments as the commercial
//! product's API returns them (JSON) into reach `[[segments]]` TOML.
//!
//! Every segment passes the policy crate's own validation before it is
//! emitted; whatever cannot be carried over is a `Finding` naming the
//! segment, never dropped silently. The mapping and its refusals are
//! recorded in docs/decisions.md ("Plan and import").

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;

use policy::{GroupSpec, PolicySpec, PortSpec, SegmentSpec};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Fields of the product's records that describe the record, not the
/// application: `id` and `description` go into the emitted comment, the
/// audit fields are left out by design.
const METADATA: &[&str] = &[
    "id",
    "description",
    "creationTime",
    "modifiedTime",
    "modifiedBy",
];

/// Longest name reach accepts (policy's name rule).
const MAX_NAME: usize = 128;

/// How the import maps the product's server groups.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Server group (name or id) → reach connector group.
    pub group_map: BTreeMap<String, String>,
}

impl Options {
    /// Builds the map from `SERVER_GROUP=CONNECTOR_GROUP` pairs; a server
    /// group mapped twice to different groups is an error.
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = &'a (String, String)>,
    ) -> Result<Options, String> {
        let mut group_map = BTreeMap::new();
        for (from, to) in pairs {
            if let Some(before) = group_map.insert(from.clone(), to.clone())
                && before != *to
            {
                return Err(format!(
                    "--group-map maps server group {from:?} to both {before:?} and {to:?}"
                ));
            }
        }
        Ok(Options { group_map })
    }
}

/// Parses one `--group-map SERVER_GROUP=CONNECTOR_GROUP` value.
pub fn parse_group_map(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((from, to)) if !from.trim().is_empty() && !to.trim().is_empty() => {
            Ok((from.trim().to_owned(), to.trim().to_owned()))
        }
        _ => Err(format!(
            "{text:?} is not SERVER_GROUP=CONNECTOR_GROUP (both sides non-empty)"
        )),
    }
}

/// How much of a segment a finding costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Carried over in another form (a name made valid or unique).
    Adjusted,
    /// The segment is emitted without this field or value.
    Dropped,
    /// The segment is not emitted.
    Refused,
}

/// Something the import could not carry over as it was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The segment's name in the input (or `#N`, its 1-based position).
    pub segment: String,
    /// What it costs.
    pub severity: Severity,
    /// A sentence saying what and why.
    pub message: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let label = match self.severity {
            Severity::Adjusted => "note",
            Severity::Dropped => "not carried over",
            Severity::Refused => "refused",
        };
        write!(f, "segment {:?}: {label}: {}", self.segment, self.message)
    }
}

/// Whether everything carried over; the binary's exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every segment and field carried over (names may be adjusted): 0.
    Complete,
    /// Every segment emitted, some fields or server groups not: 3.
    FieldsDropped,
    /// Some segments not emitted: 4.
    SegmentsRefused,
}

impl Outcome {
    /// The process exit code (1 is a failed import, 2 a usage error).
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Complete => 0,
            Outcome::FieldsDropped => 3,
            Outcome::SegmentsRefused => 4,
        }
    }
}

/// Why nothing could be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The input is not JSON.
    #[error("not JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The JSON is neither an array nor a `{"list": [...]}` page.
    #[error(
        "expected a JSON array of application segments or an object with a \"list\" array, found {0}"
    )]
    Shape(&'static str),
    /// The converted segments do not validate together (a connector group
    /// name in `--group-map` that reach does not accept, for instance).
    #[error("the imported policy is invalid:\n{}", .0.join("\n"))]
    Invalid(Vec<String>),
    /// The TOML could not be written.
    #[error("writing TOML: {0}")]
    Toml(#[from] toml::ser::Error),
}

/// One emitted segment and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImportedSegment {
    /// The reach segment, valid on its own.
    pub spec: SegmentSpec,
    /// The name in the input.
    pub source_name: String,
    /// The product's id, if any.
    pub id: Option<String>,
    /// The product's description, if any.
    pub description: Option<String>,
}

/// The result of an import.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Imported {
    /// Segments to emit, in input order.
    pub segments: Vec<ImportedSegment>,
    /// Everything not carried over as it was, in input order.
    pub findings: Vec<Finding>,
    /// Settings for the connector groups, from the product's connector
    /// groups (the first segment naming a group decides).
    pub groups: BTreeMap<String, GroupSettings>,
}

impl Imported {
    /// The connector groups the emitted segments name: the operator's
    /// config must define them.
    pub fn connector_groups(&self) -> BTreeSet<String> {
        self.segments
            .iter()
            .flat_map(|s| s.spec.connector_groups.iter().cloned())
            .collect()
    }

    /// Whether everything carried over.
    pub fn outcome(&self) -> Outcome {
        match self.findings.iter().map(|f| f.severity).max() {
            Some(Severity::Refused) => Outcome::SegmentsRefused,
            Some(Severity::Dropped) => Outcome::FieldsDropped,
            Some(Severity::Adjusted) | None => Outcome::Complete,
        }
    }

    /// The `[[segments]]` TOML, each segment under a comment naming its
    /// source; `source` names the input file in the header.
    pub fn toml(&self, source: &str) -> Result<String, ImportError> {
        let groups: Vec<String> = self.connector_groups().into_iter().collect();
        let mut out = format!(
            "# Imported by `central-authority import` from {}: {} application segment(s).\n",
            one_line(source),
            self.segments.len()
        );
        if !groups.is_empty() {
            out.push_str(&format!(
                "# Connector groups named here (define them in [[connector_groups]]): {}\n",
                groups.join(", ")
            ));
        }
        if !self.groups.is_empty() {
            out.push_str("# Their settings, from the product's connector groups:\n");
        }
        for (name, g) in &self.groups {
            let mut line = format!("#   name = {name:?}");
            if let Some(d) = &g.dns_resolution {
                line.push_str(&format!(", dns_resolution = {d:?}"));
            }
            if let Some((la, lo)) = &g.location {
                line.push_str(&format!(
                    ", location = {{ latitude = {la}, longitude = {lo} }}"
                ));
            }
            out.push_str(&format!("{line}   # from {}\n", one_line(&g.from)));
        }
        for s in &self.segments {
            out.push('\n');
            let mut origin = format!("# {:?}", one_line(&s.source_name));
            if let Some(id) = &s.id {
                origin.push_str(&format!(" (id {})", one_line(id)));
            }
            out.push_str(&origin);
            out.push('\n');
            if let Some(d) = s.description.as_deref().filter(|d| !d.trim().is_empty()) {
                out.push_str(&format!("# {}\n", one_line(d)));
            }
            out.push_str(&toml::to_string(&SegmentsOut {
                segments: vec![SegmentOut::from(&s.spec)],
            })?);
        }
        Ok(out)
    }
}

/// Collapses text into one comment-safe line.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[derive(Serialize)]
struct SegmentsOut<'a> {
    segments: Vec<SegmentOut<'a>>,
}

/// What the TOML shows of a segment: the fields the import sets.
#[derive(Serialize)]
struct SegmentOut<'a> {
    name: &'a str,
    applications: &'a [String],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    tcp_ports: &'a [PortSpec],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    udp_ports: &'a [PortSpec],
    health_reporting: Option<&'a str>,
    multimatch: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    strategy: Option<&'a str>,
    connector_groups: &'a [String],
}

impl<'a> From<&'a SegmentSpec> for SegmentOut<'a> {
    fn from(s: &'a SegmentSpec) -> Self {
        SegmentOut {
            name: &s.name,
            applications: &s.applications,
            tcp_ports: &s.tcp_ports,
            udp_ports: &s.udp_ports,
            health_reporting: s.health_reporting.as_deref(),
            multimatch: s.multimatch,
            strategy: s.strategy.as_deref(),
            connector_groups: &s.connector_groups,
        }
    }
}

/// An application segment as the product's API returns it. Everything is
/// optional so one odd record is a finding, not a failed import.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AppSegment {
    name: Option<String>,
    enabled: Option<bool>,
    domain_names: Option<Vec<String>>,
    tcp_port_ranges: Option<Vec<PortValue>>,
    udp_port_ranges: Option<Vec<PortValue>>,
    tcp_port_range: Option<Vec<FromTo>>,
    udp_port_range: Option<Vec<FromTo>>,
    health_reporting: Option<String>,
    match_style: Option<String>,
    select_connector_close_to_app: Option<bool>,
    server_groups: Option<Vec<Value>>,
    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

/// The product writes ports as strings; numbers are accepted too.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum PortValue {
    Text(String),
    Number(i64),
}

impl PortValue {
    fn text(&self) -> String {
        match self {
            PortValue::Text(t) => t.trim().to_owned(),
            PortValue::Number(n) => n.to_string(),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
struct FromTo {
    from: PortValue,
    to: PortValue,
}

/// What a reach connector group takes from the product's connector groups
/// (`serverGroups[].appConnectorGroups[]`) that serve it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupSettings {
    /// `dnsQueryType` as reach's `dns_resolution` (`ipv4`, `ipv6`, `dual`).
    pub dns_resolution: Option<String>,
    /// `latitude`, `longitude` (degrees, as written) as reach's `location`.
    pub location: Option<(String, String)>,
    /// The product's `location` text and connector group name, for the
    /// comment.
    pub from: String,
}

/// The server group fields the import reads (`appConnectorGroups` by
/// `Conversion::connector_groups`, which names what it leaves); every other
/// one holding a value is named in a finding.
const SERVER_GROUP_READ: &[&str] = &[
    "name",
    "id",
    "enabled",
    "dynamicDiscovery",
    "appConnectorGroups",
];
/// The connector group fields the import reads.
const CONNECTOR_GROUP_MAPPED: &[&str] = &[
    "name",
    "id",
    "enabled",
    "dnsQueryType",
    "latitude",
    "longitude",
    "location",
];

/// Converts the product's JSON (an array, or a `{"list": [...]}` page).
pub fn convert(json: &str, options: &Options) -> Result<Imported, ImportError> {
    let records = match serde_json::from_str::<Value>(json)? {
        Value::Array(list) => list,
        Value::Object(mut page) => match page.remove("list") {
            Some(Value::Array(list)) => list,
            Some(_) => return Err(ImportError::Shape("a \"list\" that is not an array")),
            None => return Err(ImportError::Shape("an object without \"list\"")),
        },
        Value::Null => return Err(ImportError::Shape("null")),
        Value::Bool(_) => return Err(ImportError::Shape("a boolean")),
        Value::Number(_) => return Err(ImportError::Shape("a number")),
        Value::String(_) => return Err(ImportError::Shape("a string")),
    };
    let mut imported = Imported::default();
    let mut taken = HashSet::new();
    for (i, record) in records.into_iter().enumerate() {
        let mut c = Conversion {
            label: label(&record, i),
            findings: Vec::new(),
            settings: Vec::new(),
        };
        if let Some(mut segment) = c.segment(record, options) {
            segment.spec.name = c.unique(segment.spec.name, &mut taken);
            for (group, settings) in std::mem::take(&mut c.settings) {
                match imported.groups.get(&group) {
                    Some(before) if *before != settings => c.note(
                        Severity::Dropped,
                        format!(
                            "connector group {group:?}: settings from {} differ from those taken from {}; the first are kept",
                            settings.from, before.from
                        ),
                    ),
                    Some(_) => {}
                    None => {
                        imported.groups.insert(group, settings);
                    }
                }
            }
            imported.segments.push(segment);
        }
        imported.findings.append(&mut c.findings);
    }
    let spec = PolicySpec {
        connector_groups: imported
            .connector_groups()
            .into_iter()
            .map(|name| {
                let settings = imported.groups.get(&name);
                GroupSpec {
                    dns_resolution: settings.and_then(|s| s.dns_resolution.clone()),
                    location: settings
                        .and_then(|s| s.location.as_ref())
                        .and_then(|(la, lo)| {
                            Some(policy::LocationSpec {
                                latitude: la.parse().ok()?,
                                longitude: lo.parse().ok()?,
                            })
                        }),
                    name,
                }
            })
            .collect(),
        segments: imported.segments.iter().map(|s| s.spec.clone()).collect(),
    };
    policy::validate(&spec)
        .map_err(|e| ImportError::Invalid(e.0.iter().map(ToString::to_string).collect()))?;
    Ok(imported)
}

/// How findings name a record: its name, else its position.
fn label(record: &Value, index: usize) -> String {
    match record.get("name").and_then(Value::as_str) {
        Some(name) if !name.trim().is_empty() => name.to_owned(),
        _ => format!("#{}", index + 1),
    }
}

/// One record's conversion, collecting its findings.
struct Conversion {
    label: String,
    findings: Vec<Finding>,
    /// Connector group settings this record's server groups bring.
    settings: Vec<(String, GroupSettings)>,
}

impl Conversion {
    fn note(&mut self, severity: Severity, message: String) {
        self.findings.push(Finding {
            segment: self.label.clone(),
            severity,
            message,
        });
    }

    /// Refuses the record; `None` so callers can `return self.refuse(..)`.
    fn refuse<T>(&mut self, message: String) -> Option<T> {
        self.note(Severity::Refused, message);
        None
    }

    /// The segment's health reporting (reach's name) and whether it
    /// matches inclusively, or a refusal when either is unknown.
    fn modes(&mut self, app: &AppSegment) -> Option<(&'static str, bool)> {
        let health_reporting = match app.health_reporting.as_deref() {
            // The product's own default.
            None | Some("ON_ACCESS") => "on_access",
            Some("CONTINUOUS") => "continuous",
            Some("NONE") => "none",
            Some(other) => {
                return self.refuse(format!(
                    "healthReporting {other:?} is unknown (expected CONTINUOUS, ON_ACCESS or NONE)"
                ));
            }
        };
        let multimatch = match app.match_style.as_deref() {
            None | Some("EXCLUSIVE") => false,
            Some("INCLUSIVE") => true,
            Some(other) => {
                return self.refuse(format!(
                    "matchStyle {other:?} is unknown (expected EXCLUSIVE or INCLUSIVE)"
                ));
            }
        };
        Some((health_reporting, multimatch))
    }

    fn segment(&mut self, record: Value, options: &Options) -> Option<ImportedSegment> {
        if !record.is_object() {
            return self.refuse("is not a JSON object".into());
        }
        let app: AppSegment = match serde_json::from_value(record) {
            Ok(app) => app,
            Err(e) => return self.refuse(format!("cannot be read: {e}")),
        };
        let Some(source_name) = app.name.clone().filter(|n| !n.trim().is_empty()) else {
            return self.refuse("has no name".into());
        };
        if app.enabled == Some(false) {
            return self.refuse(
                "is disabled (enabled = false); reach has no disabled segments, so it is left out"
                    .into(),
            );
        }
        let (health_reporting, multimatch) = self.modes(&app)?;
        let tcp_ports = self.ports(
            "tcpPortRanges",
            app.tcp_port_ranges.as_deref(),
            app.tcp_port_range.as_deref(),
        )?;
        let udp_ports = self.ports(
            "udpPortRanges",
            app.udp_port_ranges.as_deref(),
            app.udp_port_range.as_deref(),
        )?;
        // The product's "closest connector to the application" is reach's
        // `nearest` strategy for this segment.
        let strategy = (app.select_connector_close_to_app == Some(true))
            .then(|| policy::Strategy::Nearest.as_str().to_owned());
        let connector_groups = self.groups(app.server_groups.as_deref().unwrap_or(&[]), options)?;
        self.unknown_fields(&app.other);
        let name = self.valid_name(&source_name);
        let spec = SegmentSpec {
            name,
            applications: app
                .domain_names
                .unwrap_or_default()
                .iter()
                .map(|d| d.trim().to_owned())
                .collect(),
            tcp_ports,
            udp_ports,
            health_reporting: Some(health_reporting.into()),
            multimatch,
            connector_groups,
            strategy,
            ..SegmentSpec::default()
        };
        if let Err(errors) = policy::validate_segment(&spec) {
            for e in errors {
                self.note(Severity::Refused, e.message);
            }
            return None;
        }
        Some(ImportedSegment {
            spec,
            source_name,
            id: app.other.get("id").and_then(scalar_text),
            description: app
                .other
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_owned),
        })
    }

    /// Ports from the flat `from, to, from, to, …` list and the
    /// `[{"from", "to"}]` form together (the product often sends both,
    /// saying the same), deduplicated, as reach port specs.
    fn ports(
        &mut self,
        field: &str,
        flat: Option<&[PortValue]>,
        objects: Option<&[FromTo]>,
    ) -> Option<Vec<PortSpec>> {
        let flat = flat.unwrap_or(&[]);
        if !flat.len().is_multiple_of(2) {
            return self.refuse(format!(
                "{field} has {} entries, not from/to pairs",
                flat.len()
            ));
        }
        let pairs = flat
            .chunks_exact(2)
            .map(|p| (p[0].text(), p[1].text()))
            .chain(
                objects
                    .unwrap_or(&[])
                    .iter()
                    .map(|r| (r.from.text(), r.to.text())),
            );
        let mut out: Vec<PortSpec> = Vec::new();
        for (from, to) in pairs {
            let spec = PortSpec::Text(if from == to {
                from
            } else {
                format!("{from}-{to}")
            });
            if !out.contains(&spec) {
                out.push(spec);
            }
        }
        Some(out)
    }

    /// Maps server groups to connector groups; unmapped and disabled ones
    /// are dropped and named, and a segment left without a group is
    /// refused. Their connector groups' DNS and location settings go to
    /// `settings`; every other field holding a value is named.
    fn groups(&mut self, server_groups: &[Value], options: &Options) -> Option<Vec<String>> {
        let mut out: Vec<String> = Vec::new();
        for (i, g) in server_groups.iter().enumerate() {
            let path = format!("serverGroups[{i}]");
            let name = g
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty());
            let id = g.get("id").and_then(scalar_text);
            let key = name.map(str::to_owned).or(id.clone());
            let shown = key.clone().unwrap_or_else(|| path.clone());
            let mut dropped = Vec::new();
            leftovers(g, &path, SERVER_GROUP_READ, &mut dropped);
            if !dropped.is_empty() {
                self.note(
                    Severity::Dropped,
                    format!(
                        "server group {shown:?}: fields reach has no equivalent for: {}",
                        dropped.join(", ")
                    ),
                );
            }
            if g.get("dynamicDiscovery") == Some(&Value::Bool(false)) {
                self.note(
                    Severity::Dropped,
                    format!(
                        "server group {shown:?}: {path}.dynamicDiscovery = false (its servers \
                         list decides where traffic goes); reach's connectors always resolve the \
                         segment's applications themselves, as with dynamicDiscovery = true"
                    ),
                );
            }
            if g.get("enabled") == Some(&Value::Bool(false)) {
                self.note(
                    Severity::Dropped,
                    format!(
                        "server group {shown:?} is disabled ({path}.enabled = false): it serves nothing, so it is left out"
                    ),
                );
                continue;
            }
            let mapped = [&name.map(str::to_owned), &id]
                .into_iter()
                .flatten()
                .find_map(|key| options.group_map.get(key));
            match (mapped, key) {
                (Some(to), _) => {
                    self.connector_groups(g, &path, to);
                    if !out.contains(to) {
                        out.push(to.clone());
                    }
                }
                (None, Some(key)) => self.note(
                    Severity::Dropped,
                    format!("server group {key:?} has no --group-map"),
                ),
                (None, None) => self.note(
                    Severity::Dropped,
                    "a server group without name or id cannot be mapped".into(),
                ),
            }
        }
        if out.is_empty() {
            return self.refuse(if server_groups.is_empty() {
                "has no serverGroups, so no connector group would serve it".into()
            } else {
                "none of its server groups maps to a connector group (use --group-map SERVER_GROUP=CONNECTOR_GROUP; disabled server groups do not count)".into()
            });
        }
        Some(out)
    }

    /// The settings reach connector group `to` takes from the product's
    /// connector groups of one server group (the first enabled one that
    /// states each); the rest is named.
    fn connector_groups(&mut self, server_group: &Value, path: &str, to: &str) {
        let list = server_group
            .get("appConnectorGroups")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let mut settings = GroupSettings::default();
        let mut from = Vec::new();
        for (j, acg) in list.iter().enumerate() {
            let path = format!("{path}.appConnectorGroups[{j}]");
            let name = acg.get("name").and_then(Value::as_str).unwrap_or(&path);
            let mut dropped = Vec::new();
            leftovers(acg, &path, CONNECTOR_GROUP_MAPPED, &mut dropped);
            if !dropped.is_empty() {
                self.note(
                    Severity::Dropped,
                    format!(
                        "connector group {name:?}: fields reach has no equivalent for: {}",
                        dropped.join(", ")
                    ),
                );
            }
            if acg.get("enabled") == Some(&Value::Bool(false)) {
                self.note(
                    Severity::Dropped,
                    format!("connector group {name:?} is disabled ({path}.enabled = false): its settings are not used"),
                );
                continue;
            }
            let mut used = false;
            if settings.dns_resolution.is_none()
                && let Some(q) = acg.get("dnsQueryType").and_then(Value::as_str)
            {
                match q {
                    "IPV4" => settings.dns_resolution = Some("ipv4".into()),
                    "IPV6" => settings.dns_resolution = Some("ipv6".into()),
                    "IPV4_IPV6" => settings.dns_resolution = Some("dual".into()),
                    other => self.note(
                        Severity::Dropped,
                        format!("{path}.dnsQueryType {other:?} is unknown (expected IPV4, IPV6 or IPV4_IPV6)"),
                    ),
                }
                used |= settings.dns_resolution.is_some();
            }
            let coordinate = |k: &str| acg.get(k).and_then(scalar_text);
            if settings.location.is_none()
                && let (Some(la), Some(lo)) = (coordinate("latitude"), coordinate("longitude"))
            {
                match (la.trim().parse::<f64>(), lo.trim().parse::<f64>()) {
                    (Ok(a), Ok(o)) if policy::Location::new(a, o).is_ok() => {
                        settings.location = Some((la.trim().to_owned(), lo.trim().to_owned()));
                        used = true;
                    }
                    _ => self.note(
                        Severity::Dropped,
                        format!("{path}: latitude {la:?} / longitude {lo:?} is not a location"),
                    ),
                }
            }
            if used {
                let place = acg.get("location").and_then(Value::as_str).unwrap_or("");
                from.push(if place.is_empty() {
                    format!("connector group {name:?}")
                } else {
                    format!("connector group {name:?} ({place})")
                });
            }
        }
        if settings.dns_resolution.is_some() || settings.location.is_some() {
            settings.from = from.join(", ");
            self.settings.push((to.to_owned(), settings));
        }
    }

    /// Names every field reach does not carry over that holds a value.
    fn unknown_fields(&mut self, other: &BTreeMap<String, Value>) {
        let mut dropped = Vec::new();
        for (k, v) in other
            .iter()
            .filter(|(k, _)| !METADATA.contains(&k.as_str()))
        {
            leftovers(v, k, &[], &mut dropped);
        }
        if !dropped.is_empty() {
            self.note(
                Severity::Dropped,
                format!("fields reach has no equivalent for: {}", dropped.join(", ")),
            );
        }
    }

    /// A name reach accepts: other characters become `-`, leading dots
    /// and hyphens go, at most 128 characters.
    fn valid_name(&mut self, source: &str) -> String {
        let mapped: String = source
            .trim()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        let mut name = String::new();
        for c in mapped.trim_start_matches(['.', '-']).chars() {
            // Runs of replaced characters read better as one hyphen.
            if !(c == '-' && name.ends_with('-')) {
                name.push(c);
            }
        }
        let mut name: String = name.trim_end_matches('-').chars().take(MAX_NAME).collect();
        if name.is_empty() {
            name = "segment".into();
        }
        if name != source {
            self.note(Severity::Adjusted, format!("named {name:?} in reach"));
        }
        name
    }

    /// `name`, or `name-2`, `name-3`, … when an earlier segment took it.
    fn unique(&mut self, name: String, taken: &mut HashSet<String>) -> String {
        let mut candidate = name.clone();
        let mut n = 2;
        while taken.contains(&candidate) {
            let suffix = format!("-{n}");
            let keep = name.len().min(MAX_NAME - suffix.len());
            candidate = format!("{}{suffix}", &name[..keep]);
            n += 1;
        }
        if candidate != name {
            self.note(
                Severity::Adjusted,
                format!("named {candidate:?} in reach, since {name:?} is taken"),
            );
        }
        taken.insert(candidate.clone());
        candidate
    }
}

/// The paths and values of `v`'s fields, recursively, that hold a value,
/// but those named in `mapped` (at the top level only).
fn leftovers(v: &Value, path: &str, mapped: &[&str], out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            for (k, v) in o {
                if !mapped.contains(&k.as_str()) {
                    leftovers(v, &format!("{path}.{k}"), &[], out);
                }
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                leftovers(v, &format!("{path}[{i}]"), &[], out);
            }
        }
        v if carries_information(v) => out.push(format!("{path} = {}", short(v))),
        _ => {}
    }
}

/// Whether a value says anything: null, false, "", [] and {} do not.
fn carries_information(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => false,
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        Value::Bool(true) | Value::Number(_) => true,
    }
}

/// A value for a one-line message, cut at 40 characters.
fn short(v: &Value) -> String {
    let text = v.to_string();
    if text.chars().count() > 40 {
        format!("{}…", text.chars().take(40).collect::<String>())
    } else {
        text
    }
}

/// A string or number as text (ids come as either).
fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::Config;

    fn fixture(name: &str) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn options(pairs: &[(&str, &str)]) -> Options {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect();
        Options::from_pairs(&pairs).expect("options")
    }

    fn east_west() -> Options {
        options(&[("SG East", "dc-east"), ("SG West", "dc-west")])
    }

    /// The emitted TOML after the operator's groups, loaded as a config.
    fn load(imported: &Imported, groups: &[&str]) -> Config {
        let mut text = String::new();
        for g in groups {
            text.push_str(&format!(
                "[[connector_groups]]\nname = \"{g}\"\nprovisioning_key = \"key-{g}-08gPIV6uy46OSKO9TebGwYc7\"\n\n"
            ));
        }
        text.push_str(&imported.toml("fixture.json").expect("toml"));
        Config::from_toml(&text, Path::new("."))
            .unwrap_or_else(|e| panic!("{}\n{text}", e.messages().join("\n")))
    }

    /// A record with the given fields over a valid on-access base.
    fn one(extra: &str) -> Imported {
        one_with(extra, &east_west())
    }

    fn one_with(extra: &str, options: &Options) -> Imported {
        let mut record: serde_json::Map<String, Value> = serde_json::from_str(
            r#"{"name": "app", "domainNames": ["10.1.1.1"], "tcpPortRanges": ["22", "22"],
                "healthReporting": "ON_ACCESS", "serverGroups": [{"name": "SG East"}]}"#,
        )
        .expect("base");
        let extra: serde_json::Map<String, Value> =
            serde_json::from_str(&format!("{{{extra}}}")).expect("extra");
        record.extend(extra);
        convert(
            &Value::Array(vec![Value::Object(record)]).to_string(),
            options,
        )
        .expect("convert")
    }

    fn messages(imported: &Imported, severity: Severity) -> Vec<String> {
        imported
            .findings
            .iter()
            .filter(|f| f.severity == severity)
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn a_clean_export_carries_over_completely_and_validates() {
        let imported = convert(&fixture("import-clean.json"), &east_west()).expect("convert");
        assert_eq!(imported.findings, [], "{:?}", imported.findings);
        assert_eq!(imported.outcome(), Outcome::Complete);
        assert_eq!(imported.outcome().exit_code(), 0);
        let config = load(&imported, &["dc-east", "dc-west"]);
        let p = &config.policy;
        assert_eq!(p.segments.len(), 3);
        let jira = p.segment("jira").expect("jira");
        assert_eq!(
            jira.applications
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["jira.lanukcorp.com", "10.1.1.1"]
        );
        // The flat list and the object form said the same: no duplicates.
        assert_eq!(
            jira.tcp_ports
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["80", "8000-8010"]
        );
        assert_eq!(jira.health_reporting, policy::HealthReporting::OnAccess);
        assert_eq!(jira.connector_groups, ["dc-east"]);
        let rdp = p.segment("rdp").expect("rdp");
        assert_eq!(rdp.health_reporting, policy::HealthReporting::Continuous);
        assert_eq!(rdp.udp_ports.len(), 1);
        assert_eq!(rdp.connector_groups, ["dc-east", "dc-west"]);
        let wide = p.segment("corp-wide").expect("corp-wide");
        assert!(wide.multimatch && wide.is_discovery());
        assert_eq!(wide.health_reporting, policy::HealthReporting::None);
        // Where each segment came from is in the comments.
        let toml = imported.toml("export.json").expect("toml");
        assert!(
            toml.contains("# \"jira\" (id 216196257331291001)\n# Jira for engineering\n"),
            "{toml}"
        );
        assert!(
            toml.contains("define them in [[connector_groups]]): dc-east, dc-west"),
            "{toml}"
        );
        assert_eq!(imported.connector_groups().len(), 2);
    }

    #[test]
    fn the_paginated_form_reports_every_kind_by_name_and_still_validates() {
        let imported = convert(
            &fixture("import-page.json"),
            &options(&[("SG East", "dc-east")]),
        )
        .expect("convert");
        let all: Vec<String> = imported.findings.iter().map(ToString::to_string).collect();
        let all = all.join("\n");
        for needle in [
            "segment \"Jira Server\": note: named \"Jira-Server\" in reach",
            "segment \"extras\": not carried over: fields reach has no equivalent for: bypassType = \"NEVER\", isCnameEnabled = true",
            "segment \"half-mapped\": not carried over: server group \"SG Lab\" has no --group-map",
            "segment \"retired\": refused: is disabled (enabled = false)",
            "segment \"many-ports\": refused: health_reporting = \"continuous\" is not allowed with 12 ports (max 10)",
            "segment \"wild\": refused: health_reporting = \"continuous\" is not allowed for an application discovery segment (wildcard \"*.safemarch.com\")",
            "segment \"inclusive-continuous\": refused: multimatch = true requires health_reporting = \"on_access\" or \"none\"",
            "segment \"lab-only\": refused: none of its server groups maps to a connector group",
        ] {
            assert!(all.contains(needle), "{needle:?} missing in:\n{all}");
        }
        // Empty and false values say nothing and are not reported.
        assert!(
            !all.contains("doubleEncrypt") && !all.contains("segmentGroupName"),
            "{all}"
        );
        assert_eq!(imported.outcome(), Outcome::SegmentsRefused);
        assert_eq!(imported.outcome().exit_code(), 4);
        let names: Vec<&str> = imported
            .segments
            .iter()
            .map(|s| s.spec.name.as_str())
            .collect();
        assert_eq!(names, ["Jira-Server", "near", "extras", "half-mapped"]);
        let config = load(&imported, &["dc-east"]);
        assert_eq!(config.policy.segments.len(), 4);
        assert_eq!(
            config
                .policy
                .segment("half-mapped")
                .map(|s| s.connector_groups.clone()),
            Some(vec!["dc-east".to_owned()])
        );
    }

    #[test]
    fn select_connector_close_to_app_becomes_the_nearest_strategy() {
        let i = one(r#""selectConnectorCloseToApp": true"#);
        assert_eq!(i.segments.len(), 1);
        assert_eq!(i.outcome(), Outcome::Complete);
        assert_eq!(i.segments[0].spec.strategy.as_deref(), Some("nearest"));
        let off = one(r#""selectConnectorCloseToApp": false"#);
        assert_eq!(off.segments[0].spec.strategy, None);
    }

    #[test]
    fn unknown_fields_are_named_with_their_values() {
        let i =
            one(r#""icmpAccessType": "PING", "tcpKeepAlive": "1", "ipAnchored": false, "id": "7""#);
        assert_eq!(
            messages(&i, Severity::Dropped),
            [
                "segment \"app\": not carried over: fields reach has no equivalent for: icmpAccessType = \"PING\", tcpKeepAlive = \"1\""
            ]
        );
        assert_eq!(i.segments[0].id.as_deref(), Some("7"));
    }

    #[test]
    fn disabled_segments_are_refused() {
        let i = one(r#""enabled": false"#);
        assert!(i.segments.is_empty());
        assert_eq!(i.outcome(), Outcome::SegmentsRefused);
        // Enabled or unspecified carries over.
        assert_eq!(one(r#""enabled": true"#).outcome(), Outcome::Complete);
    }

    #[test]
    fn unmapped_server_groups_are_dropped_and_a_segment_without_any_refused() {
        let i = one(r#""serverGroups": [{"name": "SG East"}, {"id": 901}]"#);
        assert_eq!(i.segments[0].spec.connector_groups, ["dc-east"]);
        assert_eq!(
            messages(&i, Severity::Dropped),
            ["segment \"app\": not carried over: server group \"901\" has no --group-map"]
        );
        // A server group may be mapped by its id, and two to one group.
        let by_id = one_with(
            r#""serverGroups": [{"name": "SG East"}, {"id": 901}]"#,
            &options(&[("SG East", "dc-east"), ("901", "dc-east")]),
        );
        assert_eq!(by_id.segments[0].spec.connector_groups, ["dc-east"]);
        assert_eq!(by_id.outcome(), Outcome::Complete);
        let none = one(r#""serverGroups": [{"name": "SG Lab"}]"#);
        assert!(none.segments.is_empty());
        assert!(messages(&none, Severity::Refused)[0].contains("use --group-map"));
        let missing = one(r#""serverGroups": null"#);
        assert!(messages(&missing, Severity::Refused)[0].contains("has no serverGroups"));
    }

    #[test]
    fn the_rules_refuse_what_reach_refuses() {
        let many = one(r#""healthReporting": "CONTINUOUS", "tcpPortRanges": ["1", "11"]"#);
        assert!(messages(&many, Severity::Refused)[0].contains("with 11 ports (max 10)"));
        let wild = one(r#""healthReporting": "CONTINUOUS", "domainNames": ["10.0.0.0/8"]"#);
        assert!(
            messages(&wild, Severity::Refused)[0].contains("application discovery segment (subnet")
        );
        let multi = one(r#""healthReporting": "CONTINUOUS", "matchStyle": "INCLUSIVE""#);
        assert!(messages(&multi, Severity::Refused)[0].contains("multimatch = true requires"));
        let bad = one(r#""domainNames": ["*.com"]"#);
        assert!(messages(&bad, Severity::Refused)[0].contains("applications entry \"*.com\""));
        let empty = one(r#""domainNames": []"#);
        assert!(messages(&empty, Severity::Refused)[0].contains("applications is empty"));
        // Inclusive on access is fine.
        let inclusive = one(r#""matchStyle": "INCLUSIVE""#);
        assert!(inclusive.segments[0].spec.multimatch);
        assert_eq!(inclusive.outcome(), Outcome::Complete);
    }

    #[test]
    fn malformed_records_are_refused_one_by_one() {
        let odd = one(r#""tcpPortRanges": ["80", "80", "443"]"#);
        assert!(messages(&odd, Severity::Refused)[0].contains("tcpPortRanges has 3 entries"));
        let mode = one(r#""healthReporting": "SOMETIMES""#);
        assert!(
            messages(&mode, Severity::Refused)[0]
                .contains("healthReporting \"SOMETIMES\" is unknown")
        );
        let style = one(r#""matchStyle": "FUZZY""#);
        assert!(messages(&style, Severity::Refused)[0].contains("matchStyle \"FUZZY\" is unknown"));
        let typed = one(r#""enabled": "yes""#);
        assert!(messages(&typed, Severity::Refused)[0].contains("cannot be read"));
        let port = one(r#""tcpPortRanges": ["http", "http"]"#);
        assert!(messages(&port, Severity::Refused)[0].contains("is not a port number"));
        // Records without a name or that are no object are named by position.
        let i = convert(r#"[{"domainNames": ["10.1.1.1"]}, 7]"#, &east_west()).expect("convert");
        let all: Vec<String> = i.findings.iter().map(ToString::to_string).collect();
        assert_eq!(
            all,
            [
                "segment \"#1\": refused: has no name",
                "segment \"#2\": refused: is not a JSON object"
            ]
        );
    }

    #[test]
    fn numbers_and_the_object_form_are_read_as_ports() {
        let i = one(
            r#""tcpPortRanges": [], "tcpPortRange": [{"from": 8000, "to": "8100"}], "udpPortRanges": [53, 53]"#,
        );
        let s = &i.segments[0].spec;
        assert_eq!(s.tcp_ports, [PortSpec::Text("8000-8100".into())]);
        assert_eq!(s.udp_ports, [PortSpec::Text("53".into())]);
    }

    #[test]
    fn names_are_made_valid_and_unique() {
        let json = r#"[
            {"name": "Jira Server", "domainNames": ["10.1.1.1"], "tcpPortRanges": ["22","22"], "serverGroups": [{"name": "SG East"}]},
            {"name": "Jira/Server", "domainNames": ["10.1.1.2"], "tcpPortRanges": ["22","22"], "serverGroups": [{"name": "SG East"}]},
            {"name": "  --Ünïcode  ", "domainNames": ["10.1.1.3"], "tcpPortRanges": ["22","22"], "serverGroups": [{"name": "SG East"}]},
            {"name": "日本", "domainNames": ["10.1.1.4"], "tcpPortRanges": ["22","22"], "serverGroups": [{"name": "SG East"}]}
        ]"#;
        let i = convert(json, &east_west()).expect("convert");
        let names: Vec<&str> = i.segments.iter().map(|s| s.spec.name.as_str()).collect();
        assert_eq!(names, ["Jira-Server", "Jira-Server-2", "n-code", "segment"]);
        assert_eq!(i.outcome(), Outcome::Complete);
        assert!(
            messages(&i, Severity::Adjusted)
                .iter()
                .any(|m| m.contains("segment \"Jira/Server\": note: named \"Jira-Server-2\" in reach, since \"Jira-Server\" is taken")),
            "{:?}",
            i.findings
        );
        load(&i, &["dc-east"]);
        let long = format!(r#""name": "{}""#, "x".repeat(200));
        assert_eq!(one(&long).segments[0].spec.name.len(), 128);
    }

    #[test]
    fn the_input_must_be_an_array_or_a_page() {
        for (text, needle) in [
            ("{}", "an object without \"list\""),
            (r#"{"list": 3}"#, "not an array"),
            ("\"x\"", "found a string"),
            ("[", "not JSON"),
        ] {
            let e = convert(text, &east_west()).expect_err(text);
            assert!(e.to_string().contains(needle), "{text}: {e}");
        }
        let empty = convert(r#"{"list": []}"#, &east_west()).expect("empty");
        assert!(empty.segments.is_empty() && empty.outcome() == Outcome::Complete);
        load(&empty, &[]);
    }

    #[test]
    fn a_connector_group_reach_refuses_fails_the_import() {
        let e = convert(
            &fixture("import-clean.json"),
            &options(&[("SG East", "dc east"), ("SG West", "dc-west")]),
        )
        .expect_err("invalid group");
        assert!(e.to_string().contains("connector group \"dc east\""), "{e}");
    }

    #[test]
    fn group_map_arguments_parse() {
        assert_eq!(
            parse_group_map("SG East=dc-east"),
            Ok(("SG East".into(), "dc-east".into()))
        );
        assert!(parse_group_map("SG East").is_err());
        assert!(parse_group_map("=dc").is_err());
        let twice = [
            ("a".to_owned(), "x".to_owned()),
            ("a".to_owned(), "y".to_owned()),
        ];
        assert!(Options::from_pairs(&twice).is_err());
        let same = [
            ("a".to_owned(), "x".to_owned()),
            ("a".to_owned(), "x".to_owned()),
        ];
        assert!(Options::from_pairs(&same).is_ok());
    }

    /// Every leaf of `v` as (path, value), paths written as the findings
    /// write them (`a.b[0].c`).
    fn leaves(v: &Value, path: String, out: &mut Vec<(String, Value)>) {
        match v {
            Value::Object(o) => {
                for (k, v) in o {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    leaves(v, p, out);
                }
            }
            Value::Array(a) => {
                for (i, v) in a.iter().enumerate() {
                    leaves(v, format!("{path}[{i}]"), out);
                }
            }
            v => out.push((path, v.clone())),
        }
    }

    /// On a record with every field of the SDK's application segment,
    /// server group, connector group, connector and server structs, each
    /// field is mapped or named on stderr; a segment served only through a
    /// disabled server group is not emitted as live.
    #[test]
    fn every_field_of_the_sdk_structs_is_mapped_or_reported() {
        let text = fixture("import-sdk-every-field.json");
        let i = convert(
            &text,
            &options(&[("SG East", "dc-east"), ("SG Retired", "dc-west")]),
        )
        .expect("converts");
        let toml = i.toml("every.json").expect("toml");
        let stderr: String = i.findings.iter().map(|f| format!("{f}\n")).collect();
        // Mapped: the segment's fields the book lists (Segments and
        // selection, `import`; audit metadata left out by design), the server group's name/id/enabled/dynamicDiscovery,
        // its connector groups' name/id/enabled/DNS/location.
        const SERVER_GROUP_MAPPED: &[&str] = &["name", "id", "enabled", "dynamicDiscovery"];
        const TOP: &[&str] = &[
            "id",
            "name",
            "description",
            "enabled",
            "domainNames",
            "tcpPortRanges",
            "udpPortRanges",
            "tcpPortRange",
            "udpPortRange",
            "healthReporting",
            "matchStyle",
            "selectConnectorCloseToApp",
            "creationTime",
            "modifiedTime",
            "modifiedBy",
        ];
        let mapped = |path: &str| {
            let parts: Vec<&str> = path
                .split('.')
                .map(|p| p.split('[').next().unwrap_or(p))
                .collect();
            match parts.as_slice() {
                ["serverGroups", "appConnectorGroups", k] => CONNECTOR_GROUP_MAPPED.contains(k),
                ["serverGroups", k] => SERVER_GROUP_MAPPED.contains(k),
                ["serverGroups", ..] => false,
                [top, ..] => TOP.contains(top),
                [] => false,
            }
        };
        let records: Vec<Value> = serde_json::from_str(&text).expect("json");
        let mut all = Vec::new();
        leaves(&records[0], String::new(), &mut all);
        assert!(all.len() > 100, "the fixture has {} leaves", all.len());
        for (path, value) in &all {
            assert!(
                mapped(path) || stderr.contains(&format!("{path} = {}", short(value))),
                "{path} = {value} is neither mapped nor reported:\n{stderr}"
            );
        }
        // What is mapped shows: DNS and location for the group the server
        // group maps to, and the segment without its disabled server group.
        assert!(
            toml.contains("name = \"dc-east\", dns_resolution = \"ipv4\", location = { latitude = 37.3382082, longitude = -121.8863286 }")
                && toml.contains("San Jose, CA, USA"),
            "{toml}"
        );
        assert_eq!(i.segments.len(), 1, "{toml}");
        assert_eq!(i.segments[0].spec.connector_groups, ["dc-east"]);
        assert_eq!(i.segments[0].spec.udp_ports.len(), 1);
        assert!(
            stderr.contains("server group \"SG Retired\" is disabled"),
            "{stderr}"
        );
        assert!(
            stderr.contains("segment \"only retired\": refused: none of its server groups"),
            "{stderr}"
        );
        assert!(
            stderr.contains("serverGroups[0].dynamicDiscovery = false"),
            "{stderr}"
        );
        assert_eq!(i.outcome(), Outcome::SegmentsRefused);
        // The emitted segments validate against the groups they name.
        load(&i, &["dc-east"]);
    }
}
