//! OpenID Connect Back-Channel Logout 1.0: the logout token a provider
//! POSTs when a person's session there ends, validated as the spec's
//! section 2.6 says: a JWT signed with a key of the provider's JWKS (never
//! `none`), `iss` the provider, `aud` holding this CA's client id, `iat`
//! present and not in the future, `exp` (when there) not passed, the
//! back-channel logout event, `sid` or `sub`, no `nonce`, and a `jti`
//! (which the caller records, so a replay is refused).

use base64::Engine as _;
use openidconnect::JsonWebKey as _;
use openidconnect::core::{CoreJwsSigningAlgorithm, CoreProviderMetadata};
use serde_json::Value;

use super::{ProviderConfig, Providers};

/// The event a logout token must carry.
pub const BACKCHANNEL_EVENT: &str = "http://schemas.openid.net/event/backchannel-logout";

/// How far a logout token's `iat` may lie in the future, and how long an
/// `exp`-less token is remembered against replay (ms).
const CLOCK_SKEW_MS: i64 = 5 * 60 * 1000;
/// How old a logout token may be (ms): the provider sends it as the
/// session ends.
const MAX_AGE_MS: i64 = 10 * 60 * 1000;

/// A validated logout token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logout {
    /// The provider it came from (its `[[oidc]]` name).
    pub provider: String,
    /// The provider's session that ended.
    pub sid: Option<String>,
    /// The person whose sessions end (when no `sid`).
    pub sub: Option<String>,
    /// Its id, to refuse a replay.
    pub jti: String,
    /// Until when its id must be remembered, Unix ms.
    pub remember_until_ms: i64,
}

impl Providers {
    /// Validates logout token `token` against the provider among
    /// `providers` it names; why not, when it is refused.
    pub async fn logout_token(
        &self,
        providers: &[ProviderConfig],
        token: &str,
        now_ms: i64,
    ) -> Result<Logout, String> {
        let jwt = Jwt::parse(token)?;
        let iss = jwt.claims.get("iss").and_then(Value::as_str).unwrap_or("");
        let p = providers
            .iter()
            .find(|p| p.issuer == iss && audience_has(&jwt.claims, &p.client_id))
            .ok_or_else(|| {
                format!("no provider with issuer {iss:?} and this CA's client id in aud")
            })?;
        let metadata = self.metadata(p, false).await.map_err(|e| e.to_string())?;
        if let Err(e) = jwt.verify(&metadata) {
            // A key this CA has not seen: the provider rotated its keys.
            let metadata = self.metadata(p, true).await.map_err(|e| e.to_string())?;
            jwt.verify(&metadata)
                .map_err(|again| format!("{e}; {again}"))?;
        }
        claims(p, &jwt.claims, now_ms)
    }
}

/// A compact JWS, decoded but not yet verified.
pub(super) struct Jwt {
    alg: CoreJwsSigningAlgorithm,
    kid: Option<String>,
    signed: String,
    signature: Vec<u8>,
    pub(super) claims: serde_json::Map<String, Value>,
}

impl Jwt {
    pub(super) fn parse(token: &str) -> Result<Jwt, String> {
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let parts: Vec<&str> = token.trim().split('.').collect();
        let &[header, payload, signature] = parts.as_slice() else {
            return Err("not a signed JWT (three dot-separated parts)".into());
        };
        let json = |part: &str, what: &str| -> Result<serde_json::Map<String, Value>, String> {
            let bytes = b64.decode(part).map_err(|e| format!("{what}: {e}"))?;
            serde_json::from_slice(&bytes).map_err(|e| format!("{what}: {e}"))
        };
        let head = json(header, "header")?;
        let alg: CoreJwsSigningAlgorithm =
            serde_json::from_value(head.get("alg").cloned().unwrap_or(Value::Null))
                .map_err(|e| format!("header alg: {e}"))?;
        if alg == CoreJwsSigningAlgorithm::None {
            return Err("an unsigned token (alg none)".into());
        }
        Ok(Jwt {
            alg,
            kid: head.get("kid").and_then(Value::as_str).map(str::to_owned),
            signed: format!("{header}.{payload}"),
            signature: b64
                .decode(signature)
                .map_err(|e| format!("signature: {e}"))?,
            claims: json(payload, "payload")?,
        })
    }

    /// Whether a key of `metadata`'s JWKS (the one `kid` names, else any)
    /// signed it.
    pub(super) fn verify(&self, metadata: &CoreProviderMetadata) -> Result<(), String> {
        let keys = metadata.jwks().keys();
        let mut candidates = keys
            .iter()
            .filter(|k| match &self.kid {
                Some(kid) => k.key_id().is_some_and(|id| id.as_str() == kid),
                None => true,
            })
            .peekable();
        if candidates.peek().is_none() {
            return Err(format!("no key {:?} in the provider's JWKS", self.kid));
        }
        let mut last = String::new();
        for key in candidates {
            match key.verify_signature(&self.alg, self.signed.as_bytes(), &self.signature) {
                Ok(()) => return Ok(()),
                Err(e) => last = e.to_string(),
            }
        }
        Err(format!("the signature does not verify: {last}"))
    }
}

fn audience_has(claims: &serde_json::Map<String, Value>, client_id: &str) -> bool {
    match claims.get("aud") {
        Some(Value::String(a)) => a == client_id,
        Some(Value::Array(a)) => a.iter().any(|v| v.as_str() == Some(client_id)),
        _ => false,
    }
}

/// The checks of the claims of a token whose signature verified.
pub(super) fn claims(
    p: &ProviderConfig,
    c: &serde_json::Map<String, Value>,
    now_ms: i64,
) -> Result<Logout, String> {
    let text = |k: &str| c.get(k).and_then(Value::as_str).map(str::to_owned);
    let ms = |k: &str| {
        c.get(k)
            .and_then(Value::as_i64)
            .map(|s| s.saturating_mul(1000))
    };
    if text("iss").as_deref() != Some(p.issuer.as_str()) || !audience_has(c, &p.client_id) {
        return Err("iss or aud is not this provider's and this CA's".into());
    }
    let iat = ms("iat").ok_or("no iat")?;
    if iat > now_ms + CLOCK_SKEW_MS || iat < now_ms - MAX_AGE_MS {
        return Err(format!("iat {} is not within minutes of now", iat / 1000));
    }
    let exp = ms("exp");
    if exp.is_some_and(|e| e <= now_ms) {
        return Err("it expired (exp)".into());
    }
    let event = c.get("events").and_then(|e| e.get(BACKCHANNEL_EVENT));
    if !event.is_some_and(Value::is_object) {
        return Err(format!("events has no {BACKCHANNEL_EVENT:?} object"));
    }
    if c.contains_key("nonce") {
        return Err("it carries a nonce (an ID token, not a logout token)".into());
    }
    let (sid, sub) = (text("sid"), text("sub"));
    if sid.is_none() && sub.is_none() {
        return Err("it names neither sid nor sub".into());
    }
    let jti = text("jti").filter(|j| !j.is_empty()).ok_or("no jti")?;
    Ok(Logout {
        provider: p.name.clone(),
        sid,
        sub,
        jti,
        remember_until_ms: exp.unwrap_or(0).max(iat + MAX_AGE_MS + CLOCK_SKEW_MS),
    })
}
