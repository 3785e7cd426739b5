//! The Health dashboard: one server-rendered HTML page that reloads itself
//! every 2 s. Elements carry stable classes and `data-*` attributes
//! (`data-status="unknown"`, `.icon-unknown`) so browser tests can assert on
//! them without parsing text.

use std::fmt::Write;

use policy::Status;

use crate::views::{ApplicationView, ConnectorHealthView, ConnectorView, unix_ms};

/// Escapes text for HTML element content and quoted attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn icon(status: Status) -> (&'static str, &'static str) {
    match status {
        Status::Up => ("icon-up", "✓"),
        Status::Unhealthy => ("icon-unhealthy", "!"),
        Status::Down => ("icon-down", "✗"),
        Status::Unknown => ("icon-unknown", "?"),
    }
}

fn label(status: Status) -> &'static str {
    match status {
        Status::Up => "Up",
        Status::Unhealthy => "Unhealthy",
        Status::Down => "Down",
        Status::Unknown => "Unknown",
    }
}

fn badge(out: &mut String, status: Status) {
    let (class, glyph) = icon(status);
    let _ = write!(
        out,
        r#"<span class="status status-{s}" data-status="{s}"><span class="icon {class}" aria-hidden="true">{glyph}</span> {l}</span>"#,
        s = status.as_str(),
        l = label(status),
    );
}

fn age(ms: Option<u64>) -> String {
    match ms {
        None => "never".into(),
        Some(ms) if ms < 1000 => format!("{ms} ms ago"),
        Some(ms) if ms < 120_000 => format!("{} s ago", ms / 1000),
        Some(ms) => format!("{} min ago", ms / 60_000),
    }
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}\
table{border-collapse:collapse;margin-bottom:2em;width:100%}\
th,td{border:1px solid #ccc;padding:.3em .5em;vertical-align:top;text-align:left}\
th{background:#f3f3f3}.status{font-weight:600;white-space:nowrap}\
.status-up{color:#17772f}.status-unhealthy{color:#b36b00}.status-down{color:#b3261e}\
.status-unknown{color:#666}.icon{display:inline-block;width:1.2em;text-align:center}\
.icon-unknown{border:1px solid #888;border-radius:50%;font-size:.8em;line-height:1.3em}\
.connector-status{margin-bottom:.4em}.addresses{margin:.2em 0 0 1.2em;padding:0;font-size:.9em}\
.over-budget-warning{color:#b3261e;font-weight:600}.muted{color:#777;font-size:.9em}\
.transitions{font-size:.85em;color:#555;margin:0;padding-left:1em}";

/// Renders the page: the connectors table, then the applications table.
pub fn render(apps: &[ApplicationView], connectors: &[ConnectorView], budget: u64) -> String {
    let mut o = String::with_capacity(4096 + apps.len() * 512);
    let _ = write!(
        o,
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="2"><title>reach — Health</title><style>{STYLE}</style></head><body><h1>Health</h1><p class="muted">Refreshes every 2 s. Check budget: {budget} checks per connector cycle.</p>"#
    );
    connectors_table(&mut o, connectors, budget);
    applications_table(&mut o, apps);
    let _ = write!(
        o,
        r#"<p class="muted" data-rendered-at="{}">reach central authority</p></body></html>"#,
        unix_ms(std::time::SystemTime::now())
    );
    o
}

/// One row per connector: session state, check load, budget warning.
fn connectors_table(o: &mut String, connectors: &[ConnectorView], budget: u64) {
    o.push_str(r#"<h2>Connectors</h2><table id="connectors"><thead><tr><th>Connector</th><th>Group</th><th>Session</th><th>Check load</th><th>Version</th></tr></thead><tbody>"#);
    if connectors.is_empty() {
        o.push_str(
            r#"<tr><td colspan="5" class="muted">No connector has connected yet.</td></tr>"#,
        );
    }
    for c in connectors {
        let _ = write!(
            o,
            r#"<tr class="connector" data-connector="{n}" data-group="{g}" data-connected="{conn}" data-over-budget="{ob}"><td>{n}</td><td>{g}</td><td>{state}</td><td><span class="check-load">{checks} checks per cycle, {cycle:.1} s cycle</span>"#,
            n = esc(&c.name),
            g = esc(&c.group),
            conn = c.connected,
            ob = c.over_budget,
            state = if c.connected {
                "connected"
            } else {
                "disconnected"
            },
            checks = c.checks_per_cycle,
            cycle = c.cycle_seconds,
        );
        if let Some(l) = &c.load {
            let _ = write!(
                o,
                r#"<br><span class="muted">reported: {} checks/cycle, {:.1} checks/s of {}, queue {}, in flight {}</span>"#,
                l.checks_per_cycle, l.checks_per_second, l.rate_limit, l.queue_depth, l.in_flight
            );
        }
        if c.over_budget {
            let _ = write!(
                o,
                r#"<br><span class="over-budget-warning" role="alert">⚠ over budget: {} checks per cycle exceed {}</span>"#,
                c.checks_per_cycle, budget
            );
        }
        let _ = write!(o, "</td><td>{}</td></tr>", esc(&c.version));
    }
    o.push_str("</tbody></table>");
}

/// One row per application: its status, each connector's view of it, and
/// its latest status changes.
fn applications_table(o: &mut String, apps: &[ApplicationView]) {
    o.push_str(r#"<h2>Applications</h2><table id="applications"><thead><tr><th>Segment</th><th>Application</th><th>Status</th><th>Per connector</th><th>Recent changes</th></tr></thead><tbody>"#);
    if apps.is_empty() {
        o.push_str(r#"<tr><td colspan="5" class="muted">No applications to show.</td></tr>"#);
    }
    for a in apps {
        let _ = write!(
            o,
            r#"<tr class="application" data-segment="{s}" data-host="{h}" data-protocol="{p}" data-port="{port}" data-status="{st}"><td>{s}<br><span class="muted">{mode}</span></td><td>{h}:{port}/{p}</td><td>"#,
            s = esc(&a.segment),
            h = esc(&a.host),
            p = a.protocol,
            port = a.port,
            st = a.status.as_str(),
            mode = a.health_reporting,
        );
        badge(o, a.status);
        o.push_str("</td><td>");
        if a.connectors.is_empty() {
            o.push_str(r#"<span class="muted">no connector in the segment's groups</span>"#);
        }
        for c in &a.connectors {
            connector_health(o, c);
        }
        o.push_str(r#"</td><td><ul class="transitions">"#);
        for t in a.transitions.iter().rev().take(5) {
            let _ = write!(
                o,
                r#"<li data-at="{}">{}: {} → {} ({})</li>"#,
                t.at,
                esc(&t.connector),
                t.from,
                t.to,
                t.cause.replace('_', " ")
            );
        }
        o.push_str("</ul></td></tr>");
    }
    o.push_str("</tbody></table>");
}

/// One connector's view of an application: status, report age, why it is
/// unknown, the DNS error and the per-address results.
fn connector_health(o: &mut String, c: &ConnectorHealthView) {
    let _ = write!(
        o,
        r#"<div class="connector-status" data-connector="{n}" data-status="{st}">"#,
        n = esc(&c.connector),
        st = c.status.as_str(),
    );
    badge(o, c.status);
    let _ = write!(
        o,
        r#" <strong>{n}</strong> <span class="muted">({g}) · last report: <span class="last-report" data-reported-at="{at}">{age}</span>"#,
        n = esc(&c.connector),
        g = esc(&c.group),
        at = c.reported_at.unwrap_or(0),
        age = age(c.report_age_ms),
    );
    if c.checked_age_ms.is_some() {
        // The check's own age: staleness is judged on it, and it differs from
        // the report's when the connector re-sends a result it could not
        // check again in time.
        let _ = write!(
            o,
            r#" · checked <span class="checked-age">{}</span>"#,
            age(c.checked_age_ms)
        );
    }
    if let Some(cause) = c.unknown_cause {
        let _ = write!(
            o,
            r#" · <span class="unknown-cause">{}</span>"#,
            cause.replace('_', " ")
        );
    }
    o.push_str("</span>");
    if let Some(e) = &c.dns_error {
        let _ = write!(o, r#"<div class="dns-error">DNS: {}</div>"#, esc(e));
    }
    if !c.addresses.is_empty() {
        o.push_str(r#"<ul class="addresses">"#);
        for ad in &c.addresses {
            let _ = write!(
                o,
                r#"<li class="address" data-address="{addr}" data-status="{st}" data-method="{m}">{addr} · {m}"#,
                addr = esc(&ad.address),
                st = ad.status.as_str(),
                m = ad.method,
            );
            if let Some(rtt) = ad.rtt_ms {
                let _ = write!(o, r#" · <span class="rtt">{rtt:.2} ms</span>"#);
            }
            if let Some(e) = &ad.error {
                let _ = write!(o, r#" · <span class="error">{}</span>"#, esc(e));
            }
            o.push_str("</li>");
        }
        o.push_str("</ul>");
    }
    o.push_str("</div>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            esc(r#"<a href="x">&'"#),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }
}
