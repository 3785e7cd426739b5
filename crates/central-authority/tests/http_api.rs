//! The HTTP API as a contract, over real HTTPS on loopback: the
//! browser-safety guard (JSON bodies only, no cross-origin state changes).

mod common;

use common::*;

const ADMIN_TOKEN: &str = "tok-admin-PlQ7jmHXY1X2oyup1UokZXlp";

fn config() -> String {
    config_text(
        "",
        "discovery_timeout_ms = 400",
        &format!(
            "[[api_tokens]]\nname = \"root\"\ntoken = \"{ADMIN_TOKEN}\"\nscopes = [\"admin\"]\n"
        ),
    )
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body}"))
}

#[tokio::test]
async fn cross_origin_admin_post_is_refused_and_same_origin_accepted() {
    let ca = Ca::start(&config()).await;
    let web = ca.web();
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let revoke = "/api/v1/provisioning_keys/dc-east/revoke";

    // A page on another site (a form behind a token-adding proxy).
    let (s, body) = web
        .send_raw(
            "POST",
            revoke,
            &[
                ("authorization", &bearer),
                ("origin", "https://evil.example"),
            ],
            "",
        )
        .await;
    assert_eq!(s, 403, "{body}");
    let v = json(&body);
    assert_eq!(v["error"]["reason"], "cross_origin", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("evil.example")),
        "{v}"
    );
    // Fetch metadata says cross-site although the Origin is withheld.
    let (s, body) = web
        .send_raw(
            "POST",
            revoke,
            &[("authorization", &bearer), ("sec-fetch-site", "cross-site")],
            "",
        )
        .await;
    assert_eq!(
        (s, json(&body)["error"]["reason"].clone()),
        (403, "cross_origin".into())
    );
    // Nothing changed: the key is still usable.
    let (s, v) = web
        .get_json("/api/v1/provisioning_keys", Some(ADMIN_TOKEN))
        .await;
    assert_eq!(s, 200, "{v}");
    let east = v["provisioning_keys"]
        .as_array()
        .and_then(|keys| keys.iter().find(|k| k["group"] == "dc-east"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(east["usable"], true, "{v}");

    // The dashboard's own origin: accepted.
    let own = format!("https://{}", ca.http);
    let (s, body) = web
        .send_raw(
            "POST",
            revoke,
            &[
                ("authorization", &bearer),
                ("origin", &own),
                ("sec-fetch-site", "same-origin"),
            ],
            "",
        )
        .await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(json(&body)["revoked"], true);
    // And a script without Origin (curl): accepted.
    let (s, body) = web
        .send_raw(
            "POST",
            "/api/v1/provisioning_keys/dc-west/revoke",
            &[("authorization", &bearer)],
            "",
        )
        .await;
    assert_eq!(s, 200, "{body}");
    ca.stop().await;
}

#[tokio::test]
async fn bodies_must_be_json() {
    let ca = Ca::start(&config()).await;
    let web = ca.web();
    let bearer = format!("Bearer {ACCESS_TOKEN}");
    let body = r#"{"host":"jira.test.reach","protocol":"tcp","port":80}"#;
    for (content_type, shown) in [
        (Some("text/plain"), "text/plain"),
        (Some("application/x-www-form-urlencoded"), "x-www-form"),
        (None, "no Content-Type"),
    ] {
        let mut headers = vec![("authorization", bearer.as_str())];
        if let Some(t) = content_type {
            headers.push(("content-type", t));
        }
        let (s, text) = web.send_raw("POST", "/api/v1/access", &headers, body).await;
        assert_eq!(s, 415, "{text}");
        let v = json(&text);
        assert_eq!(v["error"]["reason"], "unsupported_media_type", "{v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("application/json") && message.contains(shown),
            "{message}"
        );
    }
    // The same body as JSON is answered (a refusal: no connector yet).
    let (s, text) = web
        .send_raw(
            "POST",
            "/api/v1/access",
            &[
                ("authorization", &bearer),
                ("content-type", "application/json; charset=utf-8"),
            ],
            body,
        )
        .await;
    assert_eq!(s, 503, "{text}");
    assert_eq!(json(&text)["error"]["reason"], "no_connector");
    ca.stop().await;
}

/// Every operation of the served document reaches a handler (no
/// `no_route` / `method_not_allowed`), answers JSON errors only, and the
/// served document is the committed one.
#[tokio::test]
async fn every_documented_operation_is_served() {
    let ca = Ca::start(&config()).await;
    let web = ca.web();
    let (s, text) = web.send_raw("GET", "/api/v1/openapi.json", &[], "").await;
    assert_eq!(s, 200);
    let committed = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json"),
    )
    .expect("docs/openapi.json");
    assert_eq!(
        text, committed,
        "the served document is not docs/openapi.json"
    );
    let doc = json(&text);
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let mut seen = 0;
    for (path, item) in doc["paths"].as_object().expect("paths") {
        let concrete = path
            .replace("{group}", "dc-east")
            .replace("{name}", "nobody")
            .replace("{action}", "enable");
        for (method, op) in item.as_object().expect("item") {
            let body = if op["requestBody"].is_object() {
                r#"{"host":"jira.test.reach","protocol":"tcp","port":80}"#
            } else {
                ""
            };
            let mut headers = vec![("authorization", bearer.as_str())];
            if !body.is_empty() {
                headers.push(("content-type", "application/json"));
            }
            // A stream (server-sent events) never ends: its status and
            // content type are what there is to check.
            if op["responses"]["200"]["content"]["text/event-stream"].is_object() {
                let (s, headers, _body) = web.open(&concrete, Some(ADMIN_TOKEN)).await;
                assert_eq!(s, 200, "{method} {concrete}");
                assert!(
                    headers
                        .iter()
                        .any(|(k, v)| k == "content-type" && v.starts_with("text/event-stream")),
                    "{method} {concrete}: {headers:?}"
                );
                seen += 1;
                continue;
            }
            let (s, text) = web
                .send_raw(&method.to_uppercase(), &concrete, &headers, body)
                .await;
            let documented = &op["responses"][s.to_string()];
            assert!(
                documented.is_object(),
                "{method} {concrete}: status {s} is not documented: {text}"
            );
            // The sign-in's refusals are pages for a browser.
            if s >= 400 && !documented["content"]["text/html"].is_object() {
                let reason = json(&text)["error"]["reason"].clone();
                assert!(
                    reason != "no_route" && reason != "method_not_allowed",
                    "{method} {concrete}: {text}"
                );
            }
            seen += 1;
        }
    }
    assert!(seen >= 11, "only {seen} operations");
    // Unknown routes and methods answer the JSON error too.
    let (s, text) = web.send_raw("GET", "/api/v1/nothing", &[], "").await;
    assert_eq!(
        (s, json(&text)["error"]["reason"].clone()),
        (404, "no_route".into())
    );
    let (s, text) = web.send_raw("PUT", "/api/v1/health", &[], "").await;
    assert_eq!(
        (s, json(&text)["error"]["reason"].clone()),
        (405, "method_not_allowed".into())
    );
    ca.stop().await;
}

/// `central-authority api …` (the real binary) against a real CA.
#[derive(Clone)]
struct Cli {
    url: String,
    ca_cert: std::path::PathBuf,
    token_file: std::path::PathBuf,
}

impl Cli {
    fn new(ca: &Ca, token: &str) -> Cli {
        let dir = scratch_dir("cli");
        let ca_cert = dir.join("ca.pem");
        std::fs::write(&ca_cert, ca.root()).expect("write root");
        let token_file = dir.join("token");
        std::fs::write(&token_file, format!("{token}\n")).expect("write token");
        Cli {
            url: format!("https://{}", ca.http),
            ca_cert,
            token_file,
        }
    }

    /// Runs `central-authority api ARGS…`: (exit code, stdout, stderr).
    async fn run(&self, args: &[&str]) -> (i32, String, String) {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_central-authority"));
        cmd.arg("api")
            .arg("--url")
            .arg(&self.url)
            .arg("--ca-cert")
            .arg(&self.ca_cert)
            .arg("--token-file")
            .arg(&self.token_file)
            .args(args)
            .env_remove("REACH_API_TOKEN");
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .expect("join")
            .expect("run the CLI");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

#[tokio::test]
async fn cli_access_exit_codes_tables_and_admin_actions() {
    let ca = Ca::start(&config()).await;
    let admin = Cli::new(&ca, ADMIN_TOKEN);

    // Refused (no connector yet): exit 3 with the reason and explanation.
    let (code, out, err) = admin.run(&["access", "jira.test.reach", "tcp", "80"]).await;
    assert_eq!(code, 3, "{out}{err}");
    assert!(out.starts_with("refused: no_connector: "), "{out}");
    assert!(
        out.contains("segment: jira (entry jira.test.reach, mode continuous"),
        "{out}"
    );

    // A connector reports the application up: selected, exit 0.
    let (c1, _) = connect(&ca, "c1", "dc-east").await;
    c1.report(
        vec![app("jira", "jira.test.reach", 80, &["127.0.0.21"], &[])],
        true,
    )
    .await;
    let web = ca.web();
    eventually("c1's report lands", || async {
        web.app("jira", "jira.test.reach", 80)
            .await
            .is_some_and(|a| a["status"] == "up")
    })
    .await;
    let (code, out, err) = admin.run(&["access", "jira.test.reach", "tcp", "80"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.starts_with("selected: connector c1 (group dc-east, segment jira)"),
        "{out}"
    );
    assert!(out.contains("CANDIDATE") && out.contains("c1"), "{out}");
    let (code, out, _) = admin
        .run(&["--json", "access", "jira.test.reach", "tcp", "80"])
        .await;
    assert_eq!(code, 0);
    assert_eq!(json(&out)["connector"], "c1");

    // Health as a table, filtered by status, and as JSON.
    let (code, out, err) = admin.run(&["health", "--status", "up"]).await;
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("SEGMENT"), "{out}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("jira.test.reach") && l.contains("c1=up")),
        "{out}"
    );
    assert!(lines.iter().skip(1).all(|l| l.contains(" up ")), "{out}");
    let (_, out, _) = admin.run(&["--json", "health", "--segment", "lab"]).await;
    let v = json(&out);
    assert!(
        v["applications"]
            .as_array()
            .expect("applications")
            .iter()
            .all(|a| a["segment"] == "lab"),
        "{v}"
    );

    // Connectors, and the admin actions.
    let (code, out, _) = admin.run(&["connectors"]).await;
    assert_eq!(code, 0);
    assert!(
        out.lines()
            .any(|l| l.starts_with("c1 ") && l.contains("dc-east") && l.contains("yes")),
        "{out}"
    );
    let (code, out, err) = admin.run(&["connectors", "disable", "c1"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.trim(), "disabled=true name=c1");
    let (_, out, _) = admin.run(&["--json", "connectors"]).await;
    let v = json(&out);
    assert_eq!(v["connectors"][0]["disabled"], true, "{v}");
    let (code, _, err) = admin.run(&["connectors", "enable", "nobody"]).await;
    assert_eq!(code, 1);
    assert!(
        err.contains("404: not_found: no enrolled connector \"nobody\""),
        "{err}"
    );

    // Keys.
    let (code, out, _) = admin.run(&["keys", "list"]).await;
    assert_eq!(code, 0);
    assert!(out.contains("dc-west") && out.contains("USABLE"), "{out}");
    let (code, out, _) = admin.run(&["keys", "revoke", "dc-west"]).await;
    assert_eq!((code, out.trim()), (0, "group=dc-west revoked=true"));

    // A read token cannot act: an error (exit 1), not a refusal.
    let reader = Cli::new(&ca, READ_TOKEN);
    let (code, _, err) = reader.run(&["connectors", "revoke", "c1"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("403: forbidden"), "{err}");
    // Usage errors: exit 2.
    let ftp = Cli {
        url: "ftp://x".into(),
        ..reader.clone()
    };
    let (code, _, err) = ftp.run(&["connectors"]).await;
    assert_eq!(code, 2, "{err}");
    let (code, _, _) = reader.run(&["access", "h", "tcp"]).await;
    assert_eq!(code, 2);
    // Nothing listening: exit 1.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port");
    let nobody = Cli {
        url: format!("https://{closed}"),
        ..reader.clone()
    };
    let (code, _, err) = nobody.run(&["health"]).await;
    assert_eq!(code, 1, "{err}");
    drop(c1);
    ca.stop().await;
}

/// Every admin action on a name that does not exist answers 404 naming it
/// (the JSON error body), whatever the name (a path-like one too), and the
/// CLI exits non-zero; `api connectors` shows a revoked connector as
/// revoked.
#[tokio::test]
async fn admin_actions_on_unknown_names_are_404_and_the_cli_fails() {
    let ca = Ca::start(&config()).await;
    let web = ca.web();
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    for (method, path, shown) in [
        ("POST", "/api/v1/connectors/nobody/revoke", "nobody"),
        ("POST", "/api/v1/connectors/nobody/disable", "nobody"),
        ("POST", "/api/v1/connectors/nobody/enable", "nobody"),
        ("POST", "/api/v1/connectors/nobody/allow-reenroll", "nobody"),
        ("DELETE", "/api/v1/connectors/nobody", "nobody"),
        (
            "POST",
            "/api/v1/connectors/..%2F..%2Fetc%2Fpasswd/revoke",
            "../../etc/passwd",
        ),
        (
            "POST",
            "/api/v1/provisioning_keys/nogroup/revoke",
            "nogroup",
        ),
    ] {
        let (s, body) = web
            .send_raw(method, path, &[("authorization", &bearer)], "")
            .await;
        assert_eq!(s, 404, "{method} {path}: {body}");
        let v = json(&body);
        assert_eq!(v["error"]["reason"], "not_found", "{method} {path}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(&format!("{shown:?}"))),
            "{method} {path}: {v}"
        );
    }

    let admin = Cli::new(&ca, ADMIN_TOKEN);
    for action in ["revoke", "disable", "enable", "allow-reenroll", "delete"] {
        let (code, out, err) = admin.run(&["connectors", action, "nobody"]).await;
        assert_eq!(code, 1, "{action}: {out}{err}");
        assert!(
            err.contains("404: not_found: no enrolled connector \"nobody\""),
            "{action}: {err}"
        );
    }
    let (code, out, err) = admin.run(&["keys", "revoke", "nogroup"]).await;
    assert_eq!(code, 1, "{out}{err}");

    // A revoked connector is listed as revoked, not as enrolled.
    let (c1, _) = connect(&ca, "c1", "dc-east").await;
    let (code, out, err) = admin.run(&["connectors", "revoke", "c1"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.trim(), "certificates_revoked=1 name=c1");
    let (code, out, _) = admin.run(&["connectors"]).await;
    assert_eq!(code, 0);
    assert!(
        out.lines().next().is_some_and(|h| h.contains("STATE")),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("c1 ") && l.split_whitespace().any(|w| w == "revoked")),
        "{out}"
    );
    drop(c1);
    ca.stop().await;
}

/// Every admin action is in the audit trail with who did it (the token's
/// configured name), from where, on what and how it ended; a token
/// without the admin scope is recorded as refused and may not read the
/// trail; `api audit` prints it with readable times.
#[tokio::test]
async fn admin_actions_are_audited_with_actor_source_and_outcome() {
    let ca = Ca::start(&config()).await;
    let web = ca.web();
    let (c1, _) = connect(&ca, "c1", "dc-east").await;
    let admin = format!("Bearer {ADMIN_TOKEN}");
    let reader = format!("Bearer {READ_TOKEN}");
    let post = |path: &'static str, bearer: String| {
        let web = &web;
        async move {
            web.send_raw("POST", path, &[("authorization", &bearer)], "")
                .await
                .0
        }
    };
    assert_eq!(
        post("/api/v1/connectors/c1/disable", admin.clone()).await,
        200
    );
    assert_eq!(
        post("/api/v1/connectors/c1/revoke", reader.clone()).await,
        403
    );
    assert_eq!(
        post("/api/v1/connectors/ghost/revoke", admin.clone()).await,
        404
    );
    assert_eq!(
        post("/api/v1/connectors/c1/revoke", admin.clone()).await,
        200
    );
    assert_eq!(
        post("/api/v1/provisioning_keys/dc-west/revoke", admin.clone()).await,
        200
    );

    let (s, v) = web.get_json("/api/v1/audit", Some(ADMIN_TOKEN)).await;
    assert_eq!(s, 200, "{v}");
    let entries = v["entries"].as_array().expect("entries");
    let shown: Vec<(String, String, String, String)> = entries
        .iter()
        .map(|e| {
            (
                format!(
                    "{}:{}",
                    e["actor"]["kind"].as_str().unwrap_or("?"),
                    e["actor"]["name"].as_str().unwrap_or("?")
                ),
                e["action"].as_str().unwrap_or("?").to_owned(),
                e["target"].as_str().unwrap_or("?").to_owned(),
                e["outcome"].as_str().unwrap_or("?").to_owned(),
            )
        })
        .collect();
    let row = |a: &str, b: &str, c: &str, d: &str| {
        (a.to_owned(), b.to_owned(), c.to_owned(), d.to_owned())
    };
    assert_eq!(
        shown,
        [
            row("token:root", "provisioning_key.revoke", "dc-west", "ok"),
            row("token:root", "connector.revoke", "c1", "ok"),
            row("token:root", "connector.revoke", "ghost", "not_found"),
            row("token:ops", "connector.revoke", "c1", "refused"),
            row("token:root", "connector.disable", "c1", "ok"),
        ],
        "{v}"
    );
    assert_eq!(v["total"], 5, "{v}");
    assert!(entries.iter().all(|e| e["source"] == "127.0.0.1"), "{v}");
    assert!(
        entries[1]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("\"certificates_revoked\":1")),
        "{v}"
    );
    assert!(
        entries[3]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("admin")),
        "{v}"
    );
    let now = entries[0]["at"].as_i64().expect("at");
    assert!(
        entries
            .windows(2)
            .all(|w| w[0]["at"].as_i64() >= w[1]["at"].as_i64()),
        "newest first: {v}"
    );

    // Filters and paging (each read before is an `audit.read` entry).
    let (_, v) = web
        .get_json(
            "/api/v1/audit?actor=root&action=connector.revoke&target=c1",
            Some(ADMIN_TOKEN),
        )
        .await;
    assert_eq!(v["total"], 1, "{v}");
    let (_, v) = web
        .get_json("/api/v1/audit?per_page=2&page=4", Some(ADMIN_TOKEN))
        .await;
    assert_eq!(
        (v["pages"].clone(), v["entries"][0]["actor"]["name"].clone()),
        (4.into(), "root".into()),
        "{v}"
    );
    let (_, v) = web
        .get_json(
            &format!("/api/v1/audit?since={}", now + 60_000),
            Some(ADMIN_TOKEN),
        )
        .await;
    assert_eq!(v["total"], 0, "{v}");
    let (s, v) = web
        .get_json("/api/v1/audit?since=yesterday", Some(ADMIN_TOKEN))
        .await;
    assert_eq!(
        (s, v["error"]["reason"].clone()),
        (400, "invalid_request".into()),
        "{v}"
    );

    // Only admins read it; a refused read is an entry too.
    let (s, v) = web.get_json("/api/v1/audit", Some(READ_TOKEN)).await;
    assert_eq!(
        (s, v["error"]["reason"].clone()),
        (403, "forbidden".into()),
        "{v}"
    );
    let (_, v) = web
        .get_json("/api/v1/audit?action=audit.read", Some(ADMIN_TOKEN))
        .await;
    assert_eq!(
        (
            v["entries"][0]["actor"]["name"].clone(),
            v["entries"][0]["outcome"].clone()
        ),
        ("ops".into(), "refused".into()),
        "{v}"
    );

    // The CLI: readable UTC times, the actor and the outcome; a reader fails.
    let cli = Cli::new(&ca, ADMIN_TOKEN);
    let (code, out, err) = cli.run(&["audit", "--target", "ghost"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("TIME "), "{out}");
    assert_eq!(lines.len(), 2, "{out}");
    let words: Vec<&str> = lines[1].split_whitespace().collect();
    assert!(
        words[0].len() == 20 && words[0].starts_with("20") && words[0].ends_with('Z'),
        "{out}"
    );
    assert_eq!(
        &words[1..6],
        [
            "token:root",
            "127.0.0.1",
            "connector.revoke",
            "ghost",
            "not_found"
        ],
        "{out}"
    );
    let (code, _, err) = Cli::new(&ca, READ_TOKEN).run(&["audit"]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("403: forbidden"), "{err}");
    drop(c1);
    ca.stop().await;
}

/// Reads of the audit trail are entries of it (who, with which query),
/// admin requests with unknown tokens are counted per source and minute, and
/// an admin action or a read whose entry the store cannot write is
/// answered as failed (503 `audit_unavailable`), never done in silence:
/// here the CA's own SQLite database refuses every new audit row.
#[tokio::test]
async fn reads_of_the_trail_and_unknown_tokens_are_recorded_and_an_unrecordable_action_fails() {
    let ca = Ca::start(&config()).await;
    let web = ca.web();
    let (s, v) = web
        .get_json("/api/v1/audit?action=connector.revoke", Some(ADMIN_TOKEN))
        .await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = web.get_json("/api/v1/audit", Some(ADMIN_TOKEN)).await;
    assert_eq!(s, 200, "{v}");
    let read = &v["entries"][0];
    assert_eq!(
        (
            read["actor"]["kind"].clone(),
            read["actor"]["name"].clone(),
            read["action"].clone(),
            read["outcome"].clone(),
            read["detail"].clone()
        ),
        (
            "token".into(),
            "root".into(),
            "audit.read".into(),
            "ok".into(),
            "action=connector.revoke".into()
        ),
        "{v}"
    );

    // Admin requests with unknown tokens: one entry per source and minute,
    // with the count.
    for _ in 0..3 {
        let (s, body) = web
            .send_raw(
                "POST",
                "/api/v1/connectors/c1/disable",
                &[("authorization", "Bearer not-a-token-0123456789")],
                "",
            )
            .await;
        assert_eq!(s, 401, "{body}");
    }
    let (_, v) = web
        .get_json("/api/v1/audit?action=token.refused", Some(ADMIN_TOKEN))
        .await;
    let refused = &v["entries"][0];
    assert_eq!(
        (
            v["total"].clone(),
            refused["actor"]["kind"].clone(),
            refused["source"].clone(),
            refused["detail"].clone()
        ),
        (
            1.into(),
            "unknown".into(),
            "127.0.0.1".into(),
            "refusals: 3".into()
        ),
        "{v}"
    );

    // The store refuses audit rows from now on (as a full or broken
    // table would); everything else it still writes.
    let db = rusqlite::Connection::open(ca.data_dir.join("reach.db")).expect("the CA's database");
    db.busy_timeout(std::time::Duration::from_secs(5))
        .expect("busy timeout");
    db.execute_batch(
        "CREATE TRIGGER no_audit BEFORE INSERT ON admin_audit
         BEGIN SELECT RAISE(ABORT, 'the audit trail cannot be written'); END;",
    )
    .expect("trigger");
    let (s, body) = web
        .send_raw(
            "POST",
            "/api/v1/provisioning_keys/dc-west/revoke",
            &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))],
            "",
        )
        .await;
    assert_eq!(s, 503, "{body}");
    assert!(body.contains("audit_unavailable"), "{body}");
    let (s, v) = web.get_json("/api/v1/audit", Some(ADMIN_TOKEN)).await;
    assert_eq!(
        (s, v["error"]["reason"].clone()),
        (503, "audit_unavailable".into()),
        "{v}"
    );
    ca.stop().await;
}

/// Writes `request` as it is on a fresh TLS connection to the CA and
/// reads what comes back until the CA closes or 5 s pass.
async fn raw_exchange(ca: &Ca, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tcp = tokio::net::TcpStream::connect(ca.http)
        .await
        .expect("connect");
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(
        test_support::http::client_tls(&ca.root()),
    ));
    let name = rustls::pki_types::ServerName::IpAddress(ca.http.ip().into());
    let mut tls = tls.connect(name, tcp).await.expect("TLS handshake");
    tls.write_all(request).await.expect("write");
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, tls.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The status line and the JSON body of a raw HTTP/1.1 answer.
fn status_and_json(answer: &str) -> (String, serde_json::Value) {
    let status = answer.lines().next().unwrap_or_default().to_owned();
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (
        status,
        serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
    )
}

#[tokio::test]
async fn access_bodies_must_be_what_the_schema_says() {
    let ca = Ca::start(&config()).await;
    let web = ca.web();
    let bearer = format!("Bearer {ACCESS_TOKEN}");
    let headers = [
        ("authorization", bearer.as_str()),
        ("content-type", "application/json"),
    ];
    for (body, field) in [
        (
            r#"{"host":"jira.test.reach","protocol":"TCP","port":80}"#,
            "protocol",
        ),
        (r#"["jira.test.reach","tcp",80]"#, "object"),
    ] {
        let (s, text) = web.send_raw("POST", "/api/v1/access", &headers, body).await;
        assert_eq!(s, 400, "{body}: {text}");
        let v = json(&text);
        assert_eq!(v["error"]["reason"], "invalid_request", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(field)),
            "{v}"
        );
    }
    // The query parameter too.
    let (s, v) = web
        .get_json(
            "/api/v1/application?segment=jira&host=jira.test.reach&protocol=TCP&port=80",
            Some(ADMIN_TOKEN),
        )
        .await;
    assert_eq!(
        (s, v["error"]["reason"].clone()),
        (400, "invalid_request".into()),
        "{v}"
    );
    ca.stop().await;
}

#[tokio::test]
async fn oversized_and_malformed_bodies_are_refused_before_they_are_read() {
    let ca = Ca::start(&config()).await;
    let host = ca.http.to_string();
    // A declared 10 MiB body that waits for `100 Continue`: 413 at once.
    let answer = raw_exchange(
        &ca,
        format!(
            "POST /api/v1/access HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {ACCESS_TOKEN}\r\n\
             Content-Type: application/json\r\nContent-Length: 10485760\r\nExpect: 100-continue\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    assert!(!answer.contains("100 Continue"), "{answer}");
    let (status, v) = status_and_json(&answer);
    assert!(status.starts_with("HTTP/1.1 413"), "{answer}");
    assert_eq!(v["error"]["reason"], "invalid_request", "{answer}");
    // Broken chunked framing: 400, not 413.
    let answer = raw_exchange(
        &ca,
        format!(
            "POST /api/v1/access HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {ACCESS_TOKEN}\r\n\
             Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{{}}\r\n0\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    let (status, v) = status_and_json(&answer);
    assert!(status.starts_with("HTTP/1.1 400"), "{answer}");
    assert_eq!(v["error"]["reason"], "invalid_request", "{answer}");
    ca.stop().await;
}

#[tokio::test]
async fn hosts_and_origins_must_be_this_ca() {
    let ca = Ca::start(&config().replacen(
        "[server]\n",
        "[server]\npublic_names = [\"ca.test.reach\", \"127.0.0.1\"]\n",
        1,
    ))
    .await;
    let web = ca.web();
    // The client's own Host (127.0.0.1:port): served, with the API headers.
    let (status, headers, _) = web.open("/api/v1/health", Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 200);
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert_eq!(header("cache-control"), "no-store", "{headers:?}");
    assert_eq!(header("x-content-type-options"), "nosniff", "{headers:?}");
    assert_eq!(
        header("strict-transport-security"),
        "max-age=31536000",
        "{headers:?}"
    );
    let get = |host: &str| {
        format!(
            "GET /api/v1/health HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer \
             {ADMIN_TOKEN}\r\nConnection: close\r\n\r\n"
        )
    };
    let answer = raw_exchange(&ca, get("CA.test.reach:7480").as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // Another name (DNS rebinding): refused, naming it.
    let answer = raw_exchange(&ca, get("evil.example:7480").as_bytes()).await;
    let (status, v) = status_and_json(&answer);
    assert!(status.starts_with("HTTP/1.1 400"), "{answer}");
    assert_eq!(v["error"]["reason"], "unknown_host", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("evil.example:7480")),
        "{v}"
    );
    // HTTP/1.1 without Host: refused.
    let answer = raw_exchange(&ca, b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n").await;
    let (status, v) = status_and_json(&answer);
    assert!(status.starts_with("HTTP/1.1 400"), "{answer}");
    assert_eq!(v["error"]["reason"], "unknown_host", "{answer}");
    // An Origin of the right host and port but plain http: not this CA.
    let origin = format!("http://{}", ca.http);
    let (s, text) = web
        .send_raw(
            "POST",
            "/api/v1/provisioning_keys/dc-east/revoke",
            &[
                ("authorization", &format!("Bearer {ADMIN_TOKEN}")),
                ("origin", &origin),
            ],
            "",
        )
        .await;
    assert_eq!(s, 403, "{text}");
    assert_eq!(json(&text)["error"]["reason"], "cross_origin");
    ca.stop().await;
}

#[tokio::test]
async fn requests_hyper_refuses_get_the_json_error_too() {
    let ca = Ca::start(&config()).await;
    let host = ca.http.to_string();
    let big = "x".repeat(80 * 1024);
    for (request, status) in [
        ("GARBAGE / NONSENSE\r\n\r\n".to_owned(), "400"),
        (
            format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\nX-Big: {big}\r\n\r\n"),
            "431",
        ),
    ] {
        let answer = raw_exchange(&ca, request.as_bytes()).await;
        let (line, v) = status_and_json(&answer);
        assert!(line.starts_with(&format!("HTTP/1.1 {status}")), "{answer}");
        assert_eq!(v["error"]["reason"], "invalid_request", "{answer}");
        assert!(
            answer
                .to_ascii_lowercase()
                .contains("content-type: application/json"),
            "{answer}"
        );
    }
    ca.stop().await;
}
