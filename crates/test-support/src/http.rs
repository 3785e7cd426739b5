//! HTTP test clients: a minimal HTTPS client (hyper over tokio-rustls, one
//! connection per request) that trusts one root, and a plain HTTP/1.1 GET.

use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

/// A rustls client configuration that trusts `root_pem`.
pub fn client_tls(root_pem: &str) -> rustls::ClientConfig {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(root_pem.as_bytes()) {
        roots.add(c.expect("pem")).expect("root");
    }
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// A minimal HTTPS client (one connection per request) for a server whose
/// certificate names its IP address.
#[derive(Clone)]
pub struct HttpsClient {
    addr: SocketAddr,
    tls: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for HttpsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpsClient")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl HttpsClient {
    /// A client for `addr` that trusts `root_pem`.
    pub fn new(addr: SocketAddr, root_pem: &str) -> HttpsClient {
        HttpsClient {
            addr,
            tls: tokio_rustls::TlsConnector::from(Arc::new(client_tls(root_pem))),
        }
    }

    async fn request(
        &self,
        request: hyper::Request<Full<Bytes>>,
    ) -> hyper::Response<hyper::body::Incoming> {
        let tcp = tokio::net::TcpStream::connect(self.addr)
            .await
            .expect("connect");
        let name = rustls::pki_types::ServerName::IpAddress(self.addr.ip().into());
        let tls = self.tls.connect(name, tcp).await.expect("TLS handshake");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .expect("HTTP handshake");
        tokio::spawn(conn);
        sender.send_request(request).await.expect("HTTP request")
    }

    /// `method path` with an optional bearer `token` and JSON `body`;
    /// returns the status and the body as text.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<serde_json::Value>,
    ) -> (u16, String) {
        let mut b = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.addr.to_string());
        if let Some(t) = token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        let body = match body {
            Some(v) => {
                b = b.header("content-type", "application/json");
                Full::new(Bytes::from(v.to_string()))
            }
            None => Full::new(Bytes::new()),
        };
        let response = self.request(b.body(body).expect("request")).await;
        let status = response.status().as_u16();
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    /// `method path` with exactly the given extra `headers` (no
    /// Content-Type unless given) and a raw `body`; returns the status and
    /// the body as text.
    pub async fn send_raw(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (u16, String) {
        let mut b = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.addr.to_string());
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let request = b
            .body(Full::new(Bytes::from(body.to_owned())))
            .expect("request");
        let response = self.request(request).await;
        let status = response.status().as_u16();
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    /// `GET path` with an optional bearer `token`; the status, the
    /// headers (names lower-case) and the body as it arrives, for
    /// responses that stay open (server-sent events) or whose headers
    /// matter.
    pub async fn open(
        &self,
        path: &str,
        token: Option<&str>,
    ) -> (u16, Vec<(String, String)>, BodyReader) {
        let mut b = hyper::Request::builder()
            .method("GET")
            .uri(path)
            .header("host", self.addr.to_string());
        if let Some(t) = token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        let response = self
            .request(b.body(Full::new(Bytes::new())).expect("request"))
            .await;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        (
            status,
            headers,
            BodyReader {
                body: response.into_body(),
                text: String::new(),
            },
        )
    }

    /// `GET path`; the body as JSON (`Null` when it is not JSON).
    pub async fn get_json(&self, path: &str, token: Option<&str>) -> (u16, serde_json::Value) {
        let (s, body) = self.send("GET", path, token, None).await;
        (
            s,
            serde_json::from_str(&body).unwrap_or(serde_json::Value::Null),
        )
    }
}

/// A plain HTTP/1.1 GET that must answer 200; returns the whole response.
pub async fn http_get(addr: SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let req = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out
}

/// A response body read as it arrives (see `HttpsClient::open`).
pub struct BodyReader {
    body: hyper::body::Incoming,
    text: String,
}

impl std::fmt::Debug for BodyReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BodyReader")
            .field("text", &self.text)
            .finish()
    }
}

impl BodyReader {
    /// Reads until what arrived contains `needle` (returns everything read
    /// so far), the body ends or `within` passes (`None`).
    pub async fn read_until(
        &mut self,
        needle: &str,
        within: std::time::Duration,
    ) -> Option<String> {
        let deadline = tokio::time::Instant::now() + within;
        // Only what arrived since the last look (and a needle's length
        // before it) is searched: a long stream is not scanned anew per frame.
        let mut from = 0;
        loop {
            if self.text[from..].contains(needle) {
                return Some(self.text.clone());
            }
            from = self.text.len().saturating_sub(needle.len());
            while !self.text.is_char_boundary(from) {
                from -= 1;
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame()).await;
            match frame {
                Ok(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        self.text.push_str(&String::from_utf8_lossy(data));
                    }
                }
                _ => return None,
            }
        }
    }

    /// Everything read so far.
    pub fn text(&self) -> &str {
        &self.text
    }
}
