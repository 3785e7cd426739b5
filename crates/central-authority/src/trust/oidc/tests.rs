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
    assert!(check_url("http://localhost:8080").is_ok());
    assert!(check_url("http://idp.example").is_err());
    assert!(check_url("ftp://127.0.0.1").is_err());
    assert!(check_url("not a url").is_err());
}
