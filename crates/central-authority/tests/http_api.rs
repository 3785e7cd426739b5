//! The HTTP API as a contract, over real HTTPS on loopback: the
//! browser-safety guard (JSON bodies only, no cross-origin state changes).

mod common;

use common::*;

const ADMIN_TOKEN: &str = "tok-admin-0123456789";

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
            let (s, text) = web
                .send_raw(&method.to_uppercase(), &concrete, &headers, body)
                .await;
            let documented = &op["responses"][s.to_string()];
            assert!(
                documented.is_object(),
                "{method} {concrete}: status {s} is not documented: {text}"
            );
            if s >= 400 {
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
