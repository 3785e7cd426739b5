//! People's sign-in: OpenID Connect, authorization code flow with PKCE,
//! through the `openidconnect` crate (discovery, the authorization URL, the
//! code exchange and the ID token's verification: signature from the
//! provider's JWKS, `iss`, `aud`, `exp`, `nonce`). Its HTTP client is
//! reqwest, handed over as an async closure, trusting the provider's
//! `ca_file` when one is set and following no redirects.
//!
//! The provider's metadata (with its JWKS) is fetched on first use and
//! kept; its JWKS is fetched again once `keys_refresh_s` has passed (a
//! key the provider withdrew, as after a compromise, stops verifying
//! within that time), and an ID token signed with a key it does not hold
//! makes it fetch the JWKS again at once (the provider rotated its keys).
//!
//! A person's scopes come from the ID token's roles claim (`roles_claim`,
//! a dotted path such as `realm_access.roles`) mapped by `roles`.
//!
//! A session is confirmed with the provider again every `revalidate_s`
//! ([`Providers::revalidate`]): with the refresh token when the provider
//! issued one (its answer's ID token, else userinfo, gives the roles as
//! they are now), else userinfo with the access token. A refusal ends the
//! session; a provider that cannot be reached leaves it as it was.

use std::collections::HashMap;
use std::sync::Mutex;

use openidconnect::core::{
    CoreAuthenticationFlow, CoreClient, CoreGenderClaim, CoreJsonWebKeySet,
    CoreJweContentEncryptionAlgorithm, CoreJwsSigningAlgorithm, CoreProviderMetadata,
};
use openidconnect::{
    AdditionalClaims, AuthorizationCode, ClaimsVerificationError, ClientId, ClientSecret,
    CsrfToken, IdToken, IssuerUrl, Nonce, OAuth2TokenResponse as _, PkceCodeChallenge,
    PkceCodeVerifier, RedirectUrl, SignatureVerificationError, TokenResponse as _,
};
use serde::{Deserialize, Serialize};

use crate::credentials::auth::Scope;
use crate::ground::secret::Secret;

/// One `[[oidc]]` provider, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderConfig {
    /// Its name (`/auth/login?provider=`; the first is the default).
    pub name: String,
    /// The issuer URL (discovery at `/.well-known/openid-configuration`).
    pub issuer: String,
    /// The CA's client id there.
    pub client_id: String,
    /// The client secret; `None`: a public client (PKCE alone).
    pub client_secret: Option<Secret>,
    /// Where the provider sends the browser back (`…/auth/callback`).
    pub redirect_url: String,
    /// Scopes asked for besides `openid`.
    pub scopes: Vec<String>,
    /// PEM roots trusted for the provider's TLS (instead of the system's).
    pub ca_pem: Option<Vec<u8>>,
    /// The claim holding the person's groups or roles.
    pub roles_claim: String,
    /// Each claim value and the scopes it grants.
    pub roles: Vec<(String, Vec<Scope>)>,
    /// How long a session lasts (ms).
    pub session_lifetime_ms: u64,
    /// How long its JWKS is used before it is fetched again (ms).
    pub keys_refresh_ms: u64,
    /// How long the provider's word on a session holds before it is asked
    /// again (ms).
    pub revalidate_ms: u64,
}

/// Why a sign-in failed (shown on the refusal page, logged).
#[derive(Debug, thiserror::Error)]
pub enum SignInError {
    /// The provider could not be reached or answered nonsense.
    #[error("the OpenID provider: {0}")]
    Provider(String),
    /// The ID token did not verify.
    #[error("the ID token was refused: {0}")]
    Token(String),
    /// The person has no role mapped to a scope.
    #[error("{name} has no role that this CA maps to a scope (claim {claim:?})")]
    NoRole {
        /// Who.
        name: String,
        /// Their subject.
        subject: String,
        /// The roles claim.
        claim: String,
    },
}

/// Whether `url` may name a provider or redirect: `https`, or `http` on a
/// loopback address.
pub fn check_url(url: &str) -> Result<(), String> {
    let parsed = openidconnect::url::Url::parse(url).map_err(|e| format!("{url:?}: {e}"))?;
    match parsed.scheme() {
        "https" => Ok(()),
        "http" if is_loopback(&parsed) => Ok(()),
        _ => Err(format!(
            "{url:?}: must be https (http only to a loopback address)"
        )),
    }
}

fn is_loopback(url: &openidconnect::url::Url) -> bool {
    match url.host() {
        Some(openidconnect::url::Host::Ipv4(a)) => a.is_loopback(),
        Some(openidconnect::url::Host::Ipv6(a)) => a.is_loopback(),
        Some(openidconnect::url::Host::Domain(_)) | None => false,
    }
}

/// What the CA keeps between sending the browser to the provider and its
/// return: the PKCE verifier and the nonce.
#[derive(Clone, Debug)]
pub struct Pending {
    /// The `state` sent (and expected back).
    pub state: String,
    /// The PKCE verifier.
    pub verifier: String,
    /// The nonce the ID token must carry.
    pub nonce: String,
}

/// A verified sign-in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Person {
    /// `preferred_username`, else `email`, else `sub`.
    pub name: String,
    /// `sub`: who they are at the provider (the name may be shared).
    pub subject: String,
    /// The scopes the roles grant.
    pub scopes: Vec<Scope>,
    /// The provider's session id (`sid`), if the ID token has one.
    pub sid: Option<String>,
    /// The roles claim's values.
    pub roles: Vec<String>,
    /// What the session is re-validated with.
    pub credential: Option<Credential>,
}

/// A token the provider gave that re-validates a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Credential {
    /// A refresh token (the token endpoint).
    Refresh(String),
    /// An access token (the userinfo endpoint, while it lives).
    Access(String),
}

impl Credential {
    /// `refresh:TOKEN` or `access:TOKEN`, what is sealed.
    pub fn to_text(&self) -> String {
        match self {
            Credential::Refresh(t) => format!("refresh:{t}"),
            Credential::Access(t) => format!("access:{t}"),
        }
    }

    /// The inverse of [`Credential::to_text`].
    pub fn from_text(text: &str) -> Option<Credential> {
        match text.split_once(':')? {
            ("refresh", t) => Some(Credential::Refresh(t.to_owned())),
            ("access", t) => Some(Credential::Access(t.to_owned())),
            _ => None,
        }
    }
}

/// The provider's word on a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It stands: the roles claim's values now, and the credential to use
    /// next (`None`: the one held).
    Confirmed {
        /// The roles claim's values.
        roles: Vec<String>,
        /// A new (rotated) credential.
        credential: Option<Credential>,
    },
    /// Refused: why.
    Refused(String),
}

/// Every claim beyond the standard ones, to read the roles claim from.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
struct OtherClaims(serde_json::Map<String, serde_json::Value>);
impl AdditionalClaims for OtherClaims {}

type RolesIdToken = IdToken<
    OtherClaims,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJwsSigningAlgorithm,
>;

/// A failure of the HTTP client given to `openidconnect`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct HttpFailure(String);

/// Largest answer read from the provider.
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// A provider's metadata and when its JWKS was fetched (Unix ms).
type Known = (CoreProviderMetadata, i64);

/// The providers' metadata as discovered (per provider name and issuer).
#[derive(Debug, Default)]
pub struct Providers {
    discovered: Mutex<HashMap<(String, String), Known>>,
}

impl Providers {
    /// The URL to send the browser to, and what to keep for its return.
    pub async fn begin(&self, p: &ProviderConfig) -> Result<(String, Pending), SignInError> {
        let metadata = self.metadata(p, false).await?;
        let client = client(p, metadata)?;
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let mut request = client.authorize_url(
            CoreAuthenticationFlow::AuthorizationCode,
            CsrfToken::new_random,
            Nonce::new_random,
        );
        for s in &p.scopes {
            request = request.add_scope(openidconnect::Scope::new(s.clone()));
        }
        let (url, state, nonce) = request.set_pkce_challenge(challenge).url();
        Ok((
            url.to_string(),
            Pending {
                state: state.secret().clone(),
                verifier: verifier.secret().clone(),
                nonce: nonce.secret().clone(),
            },
        ))
    }

    /// Exchanges `code`, verifies the ID token and maps its roles.
    pub async fn finish(
        &self,
        p: &ProviderConfig,
        pending: &Pending,
        code: &str,
    ) -> Result<Person, SignInError> {
        let metadata = self.metadata(p, false).await?;
        let http = http_client(p)?;
        let token = client(p, metadata.clone())?
            .exchange_code(AuthorizationCode::new(code.to_owned()))
            .map_err(|e| SignInError::Provider(e.to_string()))?
            .set_pkce_verifier(PkceCodeVerifier::new(pending.verifier.clone()))
            .request_async(&http)
            .await
            .map_err(|e| SignInError::Provider(oauth_error(&e)))?;
        let raw = token
            .id_token()
            .ok_or_else(|| SignInError::Token("the provider sent no ID token".into()))?
            .to_string();
        let id_token: RolesIdToken = raw
            .parse()
            .map_err(|e| SignInError::Token(format!("not a JWT: {e}")))?;
        let nonce = Nonce::new(pending.nonce.clone());
        let mut person = self.verified(p, metadata, &id_token, &nonce).await?;
        person.credential = Some(match token.refresh_token() {
            Some(r) => Credential::Refresh(r.secret().clone()),
            None => Credential::Access(token.access_token().secret().clone()),
        });
        Ok(person)
    }

    /// `id_token` verified with `metadata`'s keys, or with the JWKS
    /// fetched again when it names a key this CA has not seen (the
    /// provider rotated its keys).
    async fn verified<N: openidconnect::NonceVerifier + Copy>(
        &self,
        p: &ProviderConfig,
        metadata: CoreProviderMetadata,
        id_token: &RolesIdToken,
        nonce: N,
    ) -> Result<Person, SignInError> {
        let verified = match verify(p, metadata, id_token, nonce) {
            Err(ClaimsVerificationError::SignatureVerification(
                SignatureVerificationError::NoMatchingKey,
            )) => {
                let metadata = self.metadata(p, true).await?;
                verify(p, metadata, id_token, nonce)
            }
            other => other,
        };
        verified.map_err(|e| SignInError::Token(error_chain(&e)))
    }

    /// Asks the provider whether the session of `subject` holding
    /// `credential` stands, and with which roles.
    pub async fn revalidate(
        &self,
        p: &ProviderConfig,
        subject: &str,
        credential: &Credential,
    ) -> Result<Verdict, SignInError> {
        let metadata = self.metadata(p, false).await?;
        let token = match credential {
            Credential::Access(t) => {
                return self.userinfo(p, metadata, t, subject, None).await;
            }
            Credential::Refresh(t) => t,
        };
        let http = http_client(p)?;
        let refresh = openidconnect::RefreshToken::new(token.clone());
        let client = client(p, metadata.clone())?;
        let answer = client
            .exchange_refresh_token(&refresh)
            .map_err(|e| SignInError::Provider(e.to_string()))?
            .request_async(&http)
            .await;
        let answer = match answer {
            Ok(a) => a,
            Err(openidconnect::RequestTokenError::ServerResponse(r)) => {
                return Ok(Verdict::Refused(format!(
                    "the token endpoint refused the refresh token: {r}"
                )));
            }
            Err(e) => return Err(SignInError::Provider(error_chain(&e))),
        };
        let next = answer
            .refresh_token()
            .map(|r| Credential::Refresh(r.secret().clone()));
        let Some(raw) = answer.id_token().map(ToString::to_string) else {
            let access = answer.access_token().secret().clone();
            return self.userinfo(p, metadata, &access, subject, next).await;
        };
        let id_token: RolesIdToken = raw
            .parse()
            .map_err(|e| SignInError::Token(format!("not a JWT: {e}")))?;
        // A refreshed ID token carries the sign-in's nonce or none.
        let any_nonce = |_: Option<&Nonce>| -> Result<(), String> { Ok(()) };
        let person = self.verified(p, metadata, &id_token, any_nonce).await?;
        if person.subject != subject {
            return Ok(Verdict::Refused(format!(
                "the refreshed ID token names subject {:?}, not the session's",
                person.subject
            )));
        }
        Ok(Verdict::Confirmed {
            roles: person.roles,
            credential: next,
        })
    }

    /// The userinfo endpoint's word on `subject` with `access_token`.
    async fn userinfo(
        &self,
        p: &ProviderConfig,
        metadata: CoreProviderMetadata,
        access_token: &str,
        subject: &str,
        next: Option<Credential>,
    ) -> Result<Verdict, SignInError> {
        let http = http_client(p)?;
        let client = client(p, metadata)?;
        let request = client
            .user_info(
                openidconnect::AccessToken::new(access_token.to_owned()),
                Some(openidconnect::SubjectIdentifier::new(subject.to_owned())),
            )
            .map_err(|e| SignInError::Provider(format!("userinfo: {e}")))?;
        let claims: Result<openidconnect::UserInfoClaims<OtherClaims, CoreGenderClaim>, _> =
            request.request_async(&http).await;
        use openidconnect::UserInfoError as E;
        match claims {
            Ok(c) => Ok(Verdict::Confirmed {
                roles: claim_values(&c.additional_claims().0, &p.roles_claim),
                credential: next,
            }),
            Err(E::Response(status, _, _)) if status.is_client_error() => Ok(Verdict::Refused(
                format!("the userinfo endpoint refused the access token ({status})"),
            )),
            Err(E::ClaimsVerification(e)) => {
                Ok(Verdict::Refused(format!("userinfo: {}", error_chain(&e))))
            }
            Err(e) => Err(SignInError::Provider(format!(
                "userinfo: {}",
                error_chain(&e)
            ))),
        }
    }

    /// The provider's metadata, discovered on first use; `refresh_keys`:
    /// its JWKS fetched again.
    async fn metadata(
        &self,
        p: &ProviderConfig,
        refresh_keys: bool,
    ) -> Result<CoreProviderMetadata, SignInError> {
        self.metadata_at(p, refresh_keys, crate::ground::clock::now_ms())
            .await
    }

    /// [`Self::metadata`] at `now_ms`: a JWKS fetched `keys_refresh_ms`
    /// or longer ago is fetched again.
    async fn metadata_at(
        &self,
        p: &ProviderConfig,
        refresh_keys: bool,
        now_ms: i64,
    ) -> Result<CoreProviderMetadata, SignInError> {
        let key = (p.name.clone(), p.issuer.clone());
        let known = self.lock().get(&key).cloned();
        let http = http_client(p)?;
        let provider = |e: String| SignInError::Provider(e);
        let refresh_ms = i64::try_from(p.keys_refresh_ms).unwrap_or(i64::MAX);
        let metadata = match known {
            Some((m, at)) if !refresh_keys && now_ms.saturating_sub(at) < refresh_ms => {
                return Ok(m);
            }
            Some((m, _)) => {
                let keys = CoreJsonWebKeySet::fetch_async(m.jwks_uri(), &http)
                    .await
                    .map_err(|e| provider(format!("fetching its keys (JWKS): {e}")))?;
                m.set_jwks(keys)
            }
            None => {
                let issuer =
                    IssuerUrl::new(p.issuer.clone()).map_err(|e| provider(e.to_string()))?;
                CoreProviderMetadata::discover_async(issuer, &http)
                    .await
                    .map_err(|e| {
                        provider(format!("discovery at {}: {}", p.issuer, error_chain(&e)))
                    })?
            }
        };
        self.lock().insert(key, (metadata.clone(), now_ms));
        Ok(metadata)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Known>> {
        self.discovered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The error and its causes, for a message.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

fn oauth_error<RE: std::error::Error + 'static, T: openidconnect::ErrorResponse + 'static>(
    e: &openidconnect::RequestTokenError<RE, T>,
) -> String {
    match e {
        openidconnect::RequestTokenError::ServerResponse(r) => {
            format!("the token endpoint refused the code: {r}")
        }
        other => error_chain(other),
    }
}

/// Verifies the ID token with `metadata`'s keys and maps its roles.
fn verify(
    p: &ProviderConfig,
    metadata: CoreProviderMetadata,
    id_token: &RolesIdToken,
    nonce: impl openidconnect::NonceVerifier,
) -> Result<Person, ClaimsVerificationError> {
    let client = CoreClient::from_provider_metadata(
        metadata,
        ClientId::new(p.client_id.clone()),
        p.client_secret
            .as_ref()
            .map(|s| ClientSecret::new(s.expose().to_owned())),
    );
    let claims = id_token.claims(&client.id_token_verifier(), nonce)?;
    let name = claims
        .preferred_username()
        .map(|u| u.as_str().to_owned())
        .or_else(|| claims.email().map(|e| e.as_str().to_owned()))
        .unwrap_or_else(|| claims.subject().as_str().to_owned());
    let other = &claims.additional_claims().0;
    let values = claim_values(other, &p.roles_claim);
    Ok(Person {
        name,
        subject: claims.subject().as_str().to_owned(),
        scopes: scopes_for(&p.roles, &values),
        sid: other.get("sid").and_then(|s| s.as_str()).map(str::to_owned),
        roles: values,
        credential: None,
    })
}

/// The person behind a verified sign-in, or the refusal of one without a
/// mapped role.
pub fn admitted(p: &ProviderConfig, person: Person) -> Result<Person, SignInError> {
    if person.scopes.is_empty() {
        return Err(SignInError::NoRole {
            name: person.name,
            subject: person.subject,
            claim: p.roles_claim.clone(),
        });
    }
    Ok(person)
}

/// The strings at dotted `path` of `claims` (a string or an array of them).
pub fn claim_values(
    claims: &serde_json::Map<String, serde_json::Value>,
    path: &str,
) -> Vec<String> {
    let mut parts = path.split('.');
    let Some(first) = parts.next() else {
        return Vec::new();
    };
    let mut at = claims.get(first);
    for part in parts {
        at = at.and_then(|v| v.get(part));
    }
    match at {
        Some(serde_json::Value::String(s)) => vec![s.clone()],
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

/// The scopes `values` (claim values) are granted by `roles`, each once.
pub fn scopes_for(roles: &[(String, Vec<Scope>)], values: &[String]) -> Vec<Scope> {
    let mut out = Vec::new();
    for (role, scopes) in roles {
        if values.iter().any(|v| v == role) {
            for s in scopes {
                if !out.contains(s) {
                    out.push(*s);
                }
            }
        }
    }
    out
}

type Client = openidconnect::Client<
    openidconnect::EmptyAdditionalClaims,
    openidconnect::core::CoreAuthDisplay,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    openidconnect::core::CoreJsonWebKey,
    openidconnect::core::CoreAuthPrompt,
    openidconnect::StandardErrorResponse<openidconnect::core::CoreErrorResponseType>,
    openidconnect::core::CoreTokenResponse,
    openidconnect::core::CoreTokenIntrospectionResponse,
    openidconnect::core::CoreRevocableToken,
    openidconnect::core::CoreRevocationErrorResponse,
    openidconnect::EndpointSet,
    openidconnect::EndpointNotSet,
    openidconnect::EndpointNotSet,
    openidconnect::EndpointNotSet,
    openidconnect::EndpointMaybeSet,
    openidconnect::EndpointMaybeSet,
>;

fn client(p: &ProviderConfig, metadata: CoreProviderMetadata) -> Result<Client, SignInError> {
    let redirect = RedirectUrl::new(p.redirect_url.clone())
        .map_err(|e| SignInError::Provider(format!("redirect_url: {e}")))?;
    Ok(CoreClient::from_provider_metadata(
        metadata,
        ClientId::new(p.client_id.clone()),
        p.client_secret
            .as_ref()
            .map(|s| ClientSecret::new(s.expose().to_owned())),
    )
    .set_redirect_uri(redirect))
}

/// The HTTP client `openidconnect` calls: reqwest over rustls (ring),
/// trusting `ca_pem` or the system's roots, no redirects, no proxy.
type HttpFuture = std::pin::Pin<
    Box<dyn Future<Output = Result<openidconnect::HttpResponse, HttpFailure>> + Send>,
>;

fn http_client(
    p: &ProviderConfig,
) -> Result<impl Fn(openidconnect::HttpRequest) -> HttpFuture, SignInError> {
    let tls = tls_config(p.ca_pem.as_deref())?;
    let client = reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .map_err(|e| SignInError::Provider(format!("HTTP client: {e}")))?;
    Ok(move |request: openidconnect::HttpRequest| {
        let client = client.clone();
        let fut: HttpFuture = Box::pin(async move { send(&client, request).await });
        fut
    })
}

async fn send(
    client: &reqwest::Client,
    request: openidconnect::HttpRequest,
) -> Result<openidconnect::HttpResponse, HttpFailure> {
    let fail = |e: &dyn std::error::Error| HttpFailure(error_chain(e));
    let request = reqwest::Request::try_from(request).map_err(|e| fail(&e))?;
    let response = client.execute(request).await.map_err(|e| fail(&e))?;
    let mut builder = openidconnect::http::Response::builder().status(response.status());
    for (k, v) in response.headers() {
        builder = builder.header(k, v);
    }
    let body = response.bytes().await.map_err(|e| fail(&e))?;
    if body.len() > MAX_ANSWER_BYTES {
        return Err(HttpFailure(format!(
            "answer of {} bytes (at most {MAX_ANSWER_BYTES})",
            body.len()
        )));
    }
    builder.body(body.to_vec()).map_err(|e| fail(&e))
}

fn tls_config(ca_pem: Option<&[u8]>) -> Result<rustls::ClientConfig, SignInError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let fail = |m: String| SignInError::Provider(m);
    let mut roots = rustls::RootCertStore::empty();
    match ca_pem {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| fail(format!("ca_file: {e}")))?;
                roots.add(cert).map_err(|e| fail(format!("ca_file: {e}")))?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| fail(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

mod logout;
pub use logout::{BACKCHANNEL_EVENT, Logout};

#[cfg(test)]
mod tests;
