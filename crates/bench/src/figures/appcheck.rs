//! Application-level checks with the rate limit lifted: the connector's
//! check engine (pacer + prober, a segment's `check = "http"` or
//! `"https"` with its roots) against loopback web applications, next to a
//! bare client doing the same work (TCP connect, TLS handshake verified
//! against the same roots without resumption, one HTTP/1.1 `GET` through
//! hyper, the status compared) at the same concurrency.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use connector_agent::IcmpPreference;
use connector_agent::checks::pacer::{Pacer, Priority};
use connector_agent::checks::probe::Prober;
use connector_agent::metrics::Metrics;
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use policy::{AppCheck, CheckKind, CheckTarget, Host, Protocol};
use test_support::{Certs, WebApp};
use tokio::net::TcpStream;

use super::Spec;
use super::tcp::{LoopRun, closed_loop, rate};
use crate::Mode;
use crate::report::{Figure, Goal};
use crate::stats::{median_of, per_trial};

/// The figures.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "http_checks_per_s",
        unit: "checks/s",
        goal: Goal::RatioAtLeast { ratio: 0.9 },
    },
    Spec {
        name: "https_checks_per_s",
        unit: "checks/s",
        goal: Goal::RatioAtLeast { ratio: 0.9 },
    },
];

/// Concurrency of both loops; one web application per loop (the pacer
/// coalesces concurrent checks of one target).
const CONCURRENCY: usize = 16;

/// The application's name (Host, SNI, the certificate's name).
const NAME: &str = "app.test";

/// Measures both kinds.
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs() as i64;
    let certs = Certs::issue(NAME, now - 86_400, now + 86_400)?;
    let mut figures = Vec::new();
    for (spec, kind) in [(SPECS[0], CheckKind::Http), (SPECS[1], CheckKind::Https)] {
        figures.push(measure(mode, spec, kind, &certs).await?);
    }
    Ok(figures)
}

async fn measure(mode: Mode, spec: Spec, kind: CheckKind, certs: &Certs) -> Result<Figure> {
    let duration = mode.pick(Duration::from_millis(500), Duration::from_millis(2000));
    let mut apps = Vec::with_capacity(CONCURRENCY);
    for i in 0..CONCURRENCY {
        let ip = format!("127.0.4.{}", i + 1);
        apps.push(match kind {
            CheckKind::Https => WebApp::https(&ip, 200, Some(NAME), certs).await?,
            _ => WebApp::http(&ip, 200, Some(NAME)).await?,
        });
    }
    let addrs: Arc<Vec<SocketAddr>> = Arc::new(apps.iter().map(WebApp::addr).collect());
    let check = AppCheck {
        kind,
        ca_pem: kind.uses_tls().then(|| certs.ca_pem.as_str().into()),
        ..AppCheck::default()
    };
    let prober = Arc::new(Prober::new(IcmpPreference::Off, Duration::from_secs(2)));
    let id = prober.check_id(&NAME.parse::<Host>()?, &check);
    let (pacer, pacer_task) = Pacer::spawn(
        prober,
        super::tcp::LIFTED_RATE,
        CONCURRENCY as u32,
        Metrics::new(),
    );
    let targets: Arc<Vec<CheckTarget>> = Arc::new(
        addrs
            .iter()
            .map(|a| CheckTarget {
                address: a.ip(),
                protocol: Protocol::Tcp,
                port: a.port(),
                check: id,
            })
            .collect(),
    );
    let tls = kind
        .uses_tls()
        .then(|| bare_tls(&certs.ca_pem))
        .transpose()?;
    let bare_trial = || {
        let (a, tls) = (addrs.clone(), tls.clone());
        closed_loop(CONCURRENCY, duration, move |i| {
            let (addr, tls) = (a[i], tls.clone());
            async move { bare_check(addr, tls).await }
        })
    };
    let reach_trial = || {
        let (p, t) = (pacer.clone(), targets.clone());
        closed_loop(CONCURRENCY, duration, move |i| {
            let (p, target) = (p.clone(), t[i]);
            async move {
                p.check(target, Priority::Continuous, Duration::ZERO)
                    .await
                    .reachable
            }
        })
    };
    // Warm-up, then alternating trials (as the tcp figure: the order of a
    // pair alternates, medians of the trials).
    bare_trial().await;
    let (mut bare, mut reach): (Vec<LoopRun>, Vec<LoopRun>) = (Vec::new(), Vec::new());
    for k in 0..mode.pick(1, 4) {
        if k % 2 == 0 {
            bare.push(bare_trial().await);
            reach.push(reach_trial().await);
        } else {
            reach.push(reach_trial().await);
            bare.push(bare_trial().await);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    pacer_task.abort();
    let pairs: Vec<_> = reach.iter().zip(&bare).collect();
    let (reach_n, bare_n): (u64, u64) = (
        reach.iter().map(|r| r.0).sum(),
        bare.iter().map(|b| b.0).sum(),
    );
    Ok(spec.figure(
        median_of(&reach, rate),
        Some(median_of(&bare, rate)),
        format!(
            "{reach_n} {kind} checks through Pacer+Prober (rate lifted, {CONCURRENCY} in flight) \
             vs {bare_n} bare {kind} GETs (tokio-rustls + hyper http1, same roots, no \
             resumption), {} alternating trials of {:.2} s (median; per-trial ratios {}); \
             {CONCURRENCY} loopback web applications in the same process",
            reach.len(),
            duration.as_secs_f64(),
            per_trial(&pairs, |(r, b)| rate(r) / rate(b))
        ),
    ))
}

/// The bare client's TLS: the same roots, no resumption.
fn bare_tls(ca_pem: &str) -> Result<tokio_rustls::TlsConnector> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.resumption = rustls::client::Resumption::disabled();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// One bare check: connect, TLS when asked, `GET /`, a 2xx/3xx status.
async fn bare_check(addr: SocketAddr, tls: Option<tokio_rustls::TlsConnector>) -> bool {
    let Ok(tcp) = TcpStream::connect(addr).await else {
        return false;
    };
    match tls {
        Some(tls) => {
            let Ok(name) = rustls::pki_types::ServerName::try_from(NAME) else {
                return false;
            };
            match tls.connect(name, tcp).await {
                Ok(stream) => get(stream).await,
                Err(_) => false,
            }
        }
        None => get(tcp).await,
    }
}

async fn get<S>(io: S) -> bool
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let Ok((mut sender, conn)) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(io)).await
    else {
        return false;
    };
    let Ok(request) = hyper::Request::get("/")
        .header(hyper::header::HOST, NAME)
        .body(Empty::new())
    else {
        return false;
    };
    let send = sender.send_request(request);
    tokio::pin!(conn, send);
    let response = tokio::select! {
        r = &mut send => r,
        c = &mut conn => match c {
            Ok(()) => send.await,
            Err(_) => return false,
        },
    };
    response.is_ok_and(|r| (200..400).contains(&r.status().as_u16()))
}
