use super::*;

#[test]
fn roles_claims_map_to_scopes() {
    let claims: serde_json::Map<String, serde_json::Value> = serde_json::from_str(
        r#"{"groups":["staff","reach-readers"],"realm_access":{"roles":["reach-admins"]},"one":"x"}"#,
    )
    .expect("json");
    assert_eq!(claim_values(&claims, "groups"), ["staff", "reach-readers"]);
    assert_eq!(
        claim_values(&claims, "realm_access.roles"),
        ["reach-admins"]
    );
    assert_eq!(claim_values(&claims, "one"), ["x"]);
    assert!(claim_values(&claims, "missing.path").is_empty());
    let roles = vec![
        ("reach-readers".to_owned(), vec![Scope::Read]),
        ("reach-admins".to_owned(), vec![Scope::Admin, Scope::Read]),
    ];
    assert_eq!(
        scopes_for(&roles, &["staff".into(), "reach-readers".into()]),
        [Scope::Read]
    );
    assert!(scopes_for(&roles, &["staff".into()]).is_empty());
}

#[test]
fn issuers_must_be_https_unless_on_loopback() {
    assert!(check_url("https://idp.example/realms/x").is_ok());
    assert!(check_url("http://127.0.0.1:8080").is_ok());
    assert!(check_url("http://[::1]:8080").is_ok());
    assert!(check_url("http://localhost:8080").is_err());
    assert!(check_url("http://idp.example").is_err());
    assert!(check_url("ftp://127.0.0.1").is_err());
    assert!(check_url("not a url").is_err());
}

/// An RSA key for signing test ID tokens locally (not used anywhere else).
const TEST_KEY: &str = include_str!("test-key.pem");
const ISSUER: &str = "https://idp.test.reach";

fn provider() -> ProviderConfig {
    ProviderConfig {
        name: "corp".into(),
        issuer: ISSUER.into(),
        client_id: "reach".into(),
        client_secret: Some(Secret::new("client-secret-0123456789")),
        redirect_url: "https://ca.test.reach/auth/callback".into(),
        scopes: vec![],
        ca_pem: None,
        roles_claim: "groups".into(),
        roles: vec![("reach-admins".into(), vec![Scope::Admin])],
        session_lifetime_ms: 3_600_000,
        keys_refresh_ms: 3_600_000,
        revalidate_ms: 300_000,
    }
}

fn key(kid: &str) -> openidconnect::core::CoreRsaPrivateSigningKey {
    openidconnect::core::CoreRsaPrivateSigningKey::from_pem(
        TEST_KEY,
        Some(openidconnect::JsonWebKeyId::new(kid.into())),
    )
    .expect("test key")
}

/// The provider's metadata with the public half of key `kid`.
fn metadata(kid: &str) -> CoreProviderMetadata {
    use openidconnect::PrivateSigningKey as _;
    use openidconnect::core::{CoreResponseType, CoreSubjectIdentifierType};
    CoreProviderMetadata::new(
        IssuerUrl::new(ISSUER.into()).expect("issuer"),
        openidconnect::AuthUrl::new(format!("{ISSUER}/auth")).expect("url"),
        openidconnect::JsonWebKeySetUrl::new(format!("{ISSUER}/jwks")).expect("url"),
        vec![openidconnect::ResponseTypes::new(vec![
            CoreResponseType::Code,
        ])],
        vec![CoreSubjectIdentifierType::Public],
        vec![CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha256],
        openidconnect::EmptyAdditionalProviderMetadata {},
    )
    .set_jwks(CoreJsonWebKeySet::new(vec![key(kid).as_verification_key()]))
}

fn now_s() -> i64 {
    crate::ground::clock::now_ms() / 1000
}

/// An ID token signed with key `kid`, with `claims` over the defaults.
fn signed(kid: &str, claims: serde_json::Value) -> String {
    let mut all = serde_json::json!({
        "iss": ISSUER, "aud": ["reach"], "sub": "u1", "preferred_username": "alice",
        "iat": now_s(), "exp": now_s() + 300, "nonce": "n1", "groups": ["reach-admins"],
    });
    for (k, v) in claims.as_object().expect("object") {
        all[k] = v.clone();
    }
    let claims: openidconnect::IdTokenClaims<OtherClaims, CoreGenderClaim> =
        serde_json::from_value(all).expect("claims");
    RolesIdToken::new(
        claims,
        &key(kid),
        CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha256,
        None,
        None,
    )
    .expect("signed")
    .to_string()
}

fn check(token: &str, kid: &str) -> Result<Person, ClaimsVerificationError> {
    let parsed: RolesIdToken = token.parse().expect("a JWT");
    verify(
        &provider(),
        metadata(kid),
        &parsed,
        &Nonce::new("n1".into()),
    )
}

#[test]
fn a_valid_id_token_names_the_person_and_their_scopes() {
    let person = check(&signed("k1", serde_json::json!({})), "k1").expect("valid");
    assert_eq!(person.name, "alice");
    assert_eq!(person.scopes, [Scope::Admin]);
}

#[test]
fn an_expired_id_token_is_refused() {
    let old = signed(
        "k1",
        serde_json::json!({"iat": now_s() - 7200, "exp": now_s() - 3600}),
    );
    assert!(
        matches!(check(&old, "k1"), Err(ClaimsVerificationError::Expired(_))),
        "{:?}",
        check(&old, "k1")
    );
}

#[test]
fn a_tampered_id_token_is_refused() {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let token = signed("k1", serde_json::json!({"groups": ["staff"]}));
    let parts: Vec<&str> = token.split('.').collect();
    // The payload made to claim the admin group; the signature is the
    // provider's over the original.
    let payload = String::from_utf8(b64.decode(parts[1]).expect("b64")).expect("utf-8");
    let forged = payload.replace("\"staff\"", "\"reach-admins\"");
    assert_ne!(payload, forged);
    let tampered = format!("{}.{}.{}", parts[0], b64.encode(forged), parts[2]);
    assert!(
        matches!(
            check(&tampered, "k1"),
            Err(ClaimsVerificationError::SignatureVerification(_))
        ),
        "{:?}",
        check(&tampered, "k1")
    );
}

#[test]
fn wrong_audience_issuer_nonce_or_unknown_key_are_refused() {
    let aud = signed("k1", serde_json::json!({"aud": ["someone-else"]}));
    assert!(matches!(
        check(&aud, "k1"),
        Err(ClaimsVerificationError::InvalidAudience(_))
    ));
    let iss = signed("k1", serde_json::json!({"iss": "https://evil.test.reach"}));
    assert!(matches!(
        check(&iss, "k1"),
        Err(ClaimsVerificationError::InvalidIssuer(_))
    ));
    let nonce = signed("k1", serde_json::json!({"nonce": "other"}));
    assert!(matches!(
        check(&nonce, "k1"),
        Err(ClaimsVerificationError::InvalidNonce(_))
    ));
    // Signed with a key id the CA does not hold: what makes `finish`
    // fetch the JWKS again.
    let rotated = signed("k2", serde_json::json!({}));
    assert!(matches!(
        check(&rotated, "k1"),
        Err(ClaimsVerificationError::SignatureVerification(
            SignatureVerificationError::NoMatchingKey
        ))
    ));
}

/// A JWKS endpoint on loopback serving the public half of key `kid` (which
/// `set` changes), and its URL.
async fn jwks_server(
    kid: &str,
) -> (
    String,
    std::sync::Arc<std::sync::Mutex<String>>,
    tokio::task::JoinHandle<()>,
) {
    let serving = std::sync::Arc::new(std::sync::Mutex::new(kid.to_owned()));
    let shared = serving.clone();
    let app = axum::Router::new().route(
        "/jwks",
        axum::routing::get(move || {
            let kid = shared.lock().expect("kid").clone();
            async move {
                use openidconnect::PrivateSigningKey as _;
                let set = CoreJsonWebKeySet::new(vec![key(&kid).as_verification_key()]);
                axum::Json(serde_json::to_value(set).expect("jwks"))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("listen");
    let url = format!("http://{}/jwks", listener.local_addr().expect("address"));
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, serving, task)
}

/// A key the provider withdrew stops verifying once `keys_refresh_ms`
/// has passed since the JWKS was fetched, without any unknown key id to
/// trigger a fetch; before that the kept JWKS is used as it is.
#[tokio::test]
async fn provider_keys_are_fetched_again_on_their_schedule() {
    let (url, serving, server) = jwks_server("k1").await;
    let p = provider();
    let kept = metadata("k1").set_jwks_uri(openidconnect::JsonWebKeySetUrl::new(url).expect("url"));
    let providers = Providers::default();
    let t0 = 1_000_000_000_000;
    providers
        .lock()
        .insert((p.name.clone(), p.issuer.clone()), (kept, t0));
    // The provider withdraws k1 and signs with k2 from now on.
    *serving.lock().expect("kid") = "k2".to_owned();
    let old = signed("k1", serde_json::json!({}));
    let parsed: RolesIdToken = old.parse().expect("a JWT");
    let nonce = Nonce::new("n1".into());

    let soon = t0 + i64::try_from(p.keys_refresh_ms).expect("ms") - 1;
    let m = providers.metadata_at(&p, false, soon).await.expect("kept");
    assert!(
        verify(&p, m, &parsed, &nonce).is_ok(),
        "within the refresh time"
    );

    let due = t0 + i64::try_from(p.keys_refresh_ms).expect("ms");
    let m = providers
        .metadata_at(&p, false, due)
        .await
        .expect("fetched");
    assert!(
        matches!(
            verify(&p, m, &parsed, &nonce),
            Err(ClaimsVerificationError::SignatureVerification(
                SignatureVerificationError::NoMatchingKey
            ))
        ),
        "a withdrawn key must stop verifying once the keys are due"
    );
    // Fetched at `due`: kept again until the next refresh.
    *serving.lock().expect("kid") = "k1".to_owned();
    let m = providers
        .metadata_at(&p, false, due + 1)
        .await
        .expect("kept");
    assert!(verify(&p, m, &parsed, &nonce).is_err(), "kept k2 only");
    server.abort();
}

/// A logout token signed with key `kid`, with `claims` over valid ones
/// (`null` removes one).
fn logout_token(kid: &str, claims: serde_json::Value) -> String {
    use base64::Engine as _;
    use openidconnect::PrivateSigningKey as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut all = serde_json::json!({
        "iss": ISSUER, "aud": "reach", "sub": "u1", "sid": "s1", "jti": "j1",
        "iat": now_s(), "exp": now_s() + 120,
        "events": {BACKCHANNEL_EVENT: {}},
    });
    for (k, v) in claims.as_object().expect("object") {
        if v.is_null() {
            all.as_object_mut().expect("object").remove(k);
        } else {
            all[k] = v.clone();
        }
    }
    let header = serde_json::json!({"alg": "RS256", "kid": kid, "typ": "logout+jwt"});
    let signed = format!(
        "{}.{}",
        b64.encode(header.to_string()),
        b64.encode(all.to_string())
    );
    let signature = key(kid)
        .sign(
            &CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha256,
            signed.as_bytes(),
        )
        .expect("signed");
    format!("{signed}.{}", b64.encode(signature))
}

fn check_logout(token: &str) -> Result<Logout, String> {
    let jwt = logout::Jwt::parse(token)?;
    jwt.verify(&metadata("k1"))?;
    logout::claims(&provider(), &jwt.claims, crate::ground::clock::now_ms())
}

#[test]
fn a_valid_logout_token_names_the_provider_session() {
    let l = check_logout(&logout_token("k1", serde_json::json!({}))).expect("valid");
    assert_eq!(
        (
            l.provider.as_str(),
            l.sid.as_deref(),
            l.sub.as_deref(),
            l.jti.as_str()
        ),
        ("corp", Some("s1"), Some("u1"), "j1")
    );
    assert!(l.remember_until_ms > crate::ground::clock::now_ms());
    let sub_only = logout_token("k1", serde_json::json!({"sid": null}));
    assert_eq!(check_logout(&sub_only).expect("valid").sid, None);
}

#[test]
fn logout_tokens_are_refused_as_the_spec_says() {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let refused = |claims: serde_json::Value, why: &str| {
        let token = logout_token("k1", claims.clone());
        let e = check_logout(&token).expect_err(&format!("{claims} is refused"));
        assert!(e.contains(why), "{claims}: {e}");
    };
    refused(serde_json::json!({"aud": "someone-else"}), "aud");
    refused(serde_json::json!({"iss": "https://evil.test.reach"}), "iss");
    refused(serde_json::json!({"iat": null}), "no iat");
    refused(serde_json::json!({"iat": now_s() - 3600}), "iat");
    refused(serde_json::json!({"iat": now_s() + 3600}), "iat");
    refused(serde_json::json!({"exp": now_s() - 1}), "expired");
    refused(serde_json::json!({"events": null}), "events");
    refused(
        serde_json::json!({"events": {"http://schemas.openid.net/event/other": {}}}),
        "events",
    );
    refused(
        serde_json::json!({"events": {BACKCHANNEL_EVENT: "x"}}),
        "events",
    );
    refused(serde_json::json!({"nonce": "n1"}), "nonce");
    refused(
        serde_json::json!({"sid": null, "sub": null}),
        "neither sid nor sub",
    );
    refused(serde_json::json!({"jti": null}), "no jti");

    // The signature: another key id, a changed payload, no signature.
    let other = logout_token("k2", serde_json::json!({}));
    assert!(
        check_logout(&other)
            .expect_err("unknown key")
            .contains("no key")
    );
    let token = logout_token("k1", serde_json::json!({}));
    let parts: Vec<&str> = token.split('.').collect();
    let payload = String::from_utf8(b64.decode(parts[1]).expect("b64")).expect("utf-8");
    let forged = payload.replace("\"s1\"", "\"s2\"");
    assert_ne!(payload, forged);
    let tampered = format!("{}.{}.{}", parts[0], b64.encode(forged), parts[2]);
    assert!(
        check_logout(&tampered)
            .expect_err("tampered")
            .contains("signature")
    );
    let header = b64.encode(r#"{"alg":"none"}"#);
    let unsigned = format!("{header}.{}.", parts[1]);
    assert!(
        check_logout(&unsigned)
            .expect_err("unsigned")
            .contains("alg none")
    );
}
