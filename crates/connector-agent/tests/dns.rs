//! DNS resolution against a real DNS server on loopback, counting the
//! queries it receives: one lookup per name however many ports and rounds
//! ask at once, and the last known addresses kept through a transient DNS
//! failure for the stale grace only (never through NXDOMAIN).

use std::sync::Arc;
use std::time::Duration;

use connector_agent::IcmpPreference;
use connector_agent::checks::pacer::Pacer;
use connector_agent::checks::probe::Prober;
use connector_agent::metrics::Metrics;
use connector_agent::resolver::{Resolver, TtlBounds};
use connector_agent::schedule::Scheduler;
use test_support::dns::Mode;
use test_support::{DnsServer, Segment};

const NAME: &str = "app.zone.test";

async fn server(ttl: u32) -> DnsServer {
    DnsServer::start_with_ttl(
        ([127, 0, 0, 1], 0).into(),
        "zone.test",
        &[
            (NAME, "127.0.7.1".parse().expect("ip")),
            (NAME, "::1".parse().expect("ip")),
        ],
        ttl,
    )
    .await
    .expect("DNS server")
}

fn resolver(dns: &DnsServer, min_ttl: Duration, grace: Duration) -> Resolver {
    let ttl = TtlBounds {
        min: min_ttl,
        max: Duration::from_secs(60),
    };
    Resolver::new(Some(dns.addr()), ttl)
        .expect("resolver")
        .with_stale_grace(grace)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_name_with_ten_ports_is_one_lookup() {
    let dns = server(60).await;
    let resolver = resolver(&dns, Duration::from_secs(5), Duration::from_secs(300));
    let prober = Arc::new(Prober::new(IcmpPreference::Off, Duration::from_millis(200)));
    let (pacer, pacer_task) = Pacer::spawn(prober, 1000, 64, Metrics::new());
    let (reports_tx, mut reports_rx) = tokio::sync::mpsc::unbounded_channel();
    let (scheduler, task) = Scheduler::spawn(resolver, pacer, Metrics::new(), reports_tx);
    let segment = Segment::new("ten")
        .apps([NAME])
        .tcp(9001..=9010)
        .groups(["g"])
        .proto();
    let segment = policy::Segment::try_from(segment).expect("valid segment");
    scheduler
        .apply(vec![segment], Duration::from_secs(1800))
        .await;
    // Every one of the 10 applications is due at once and reports once.
    let mut reported = std::collections::HashSet::new();
    while reported.len() < 10 {
        let batch = tokio::time::timeout(Duration::from_secs(20), reports_rx.recv())
            .await
            .expect("reports in time")
            .expect("scheduler running");
        for app in batch {
            assert!(app.checked.is_some() && app.report.dns_error.is_none());
            reported.insert(app.key().port);
        }
    }
    // One lookup: an A and an AAAA query, not 10 of each.
    assert!(dns.queries() <= 2, "{} queries", dns.queries());
    task.abort();
    pacer_task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_share_one_lookup_per_refresh() {
    // TTL 0: every refresh reaches the server (after the 300 ms minimum).
    let dns = server(0).await;
    let resolver = resolver(&dns, Duration::from_millis(300), Duration::from_secs(300));
    for refresh in 1..=2u64 {
        let all = futures::future::join_all((0..10).map(|_| resolver.resolve(NAME))).await;
        assert!(all.iter().all(|r| r.as_ref().is_ok_and(|a| a.len() == 2)));
        assert!(
            dns.queries() <= 2 * refresh,
            "refresh {refresh}: {} queries",
            dns.queries()
        );
        tokio::time::sleep(Duration::from_millis(350)).await;
    }
}

#[tokio::test]
async fn a_servfail_keeps_the_last_addresses_for_the_grace_then_fails() {
    let dns = server(0).await;
    let resolver = resolver(
        &dns,
        Duration::from_millis(200),
        Duration::from_millis(1500),
    );
    let good = resolver.resolution(NAME).await.expect("resolves");
    assert!(good.stale.is_none());
    dns.set_mode(Mode::ServFail);
    tokio::time::sleep(Duration::from_millis(250)).await;
    // Past the TTL, the server fails: the last answer, marked stale.
    let stale = resolver.resolution(NAME).await.expect("stale answer");
    assert_eq!(stale.addresses, good.addresses);
    let failure = stale.stale.expect("marked stale");
    assert!(failure.transient);
    assert!(failure.reason.contains("SERVFAIL"), "{}", failure.reason);
    // Past the grace (1.5 s after the answer expired): the failure itself.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let err = resolver.resolution(NAME).await.expect_err("grace over");
    assert!(err.transient, "{}", err.reason);
    // The server recovers: fresh again.
    dns.set_mode(Mode::Answer);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let again = resolver.resolution(NAME).await.expect("recovered");
    assert!(again.stale.is_none());
}

#[tokio::test]
async fn a_stopped_dns_server_keeps_the_last_addresses_within_the_grace() {
    let dns = server(0).await;
    let resolver = resolver(&dns, Duration::from_millis(200), Duration::from_secs(300));
    let good = resolver.resolve(NAME).await.expect("resolves");
    dns.stop().await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    let stale = resolver.resolution(NAME).await.expect("stale answer");
    assert_eq!(stale.addresses, good);
    println!("stopped server: {:?}", stale.stale);
    assert!(stale.stale.is_some_and(|f| f.transient));
}

#[tokio::test]
async fn nxdomain_is_a_failure_at_once_despite_a_previous_answer() {
    let dns = server(0).await;
    let resolver = resolver(&dns, Duration::from_millis(200), Duration::from_secs(300));
    resolver.resolve(NAME).await.expect("resolves");
    dns.set_mode(Mode::NxDomain);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let err = resolver.resolution(NAME).await.expect_err("gone");
    assert!(!err.transient);
    assert!(err.reason.starts_with("NXDOMAIN"), "{}", err.reason);
}

/// The group's `dns_resolution` decides which records are
/// asked for: only A, only AAAA, or both (one query each).
#[tokio::test]
async fn dns_resolution_asks_only_the_records_of_its_family() {
    use policy::DnsResolution;
    let dns = server(60).await;
    let resolver = resolver(&dns, Duration::from_secs(5), Duration::from_secs(300));
    let v4: std::net::IpAddr = "127.0.7.1".parse().expect("ip");
    let v6: std::net::IpAddr = "::1".parse().expect("ip");
    assert_eq!(resolver.dns_resolution(), DnsResolution::Dual);
    let both = resolver.resolve(NAME).await.expect("dual");
    let mut both = both.to_vec();
    both.sort();
    assert_eq!(both, vec![v4, v6]);
    let before = dns.queries();
    assert_eq!(before, 2, "an A and an AAAA query");

    resolver.set_dns_resolution(DnsResolution::Ipv6);
    let only6 = resolver.resolve(NAME).await.expect("ipv6");
    assert_eq!(only6.to_vec(), vec![v6]);
    assert_eq!(dns.queries(), before + 1, "one AAAA query, no A");

    resolver.set_dns_resolution(DnsResolution::Ipv4);
    let only4 = resolver.resolve(NAME).await.expect("ipv4");
    assert_eq!(only4.to_vec(), vec![v4]);
    assert_eq!(dns.queries(), before + 2, "one A query, no AAAA");
    // Cached under its own choice: asking again costs nothing.
    assert_eq!(
        resolver.resolve(NAME).await.expect("cached").to_vec(),
        vec![v4]
    );
    assert_eq!(dns.queries(), before + 2);

    // A name with only an A record has no address under `ipv6`: Down with
    // the reason naming the records asked for.
    dns.add("v4only.zone.test", v4).await.expect("record");
    resolver.set_dns_resolution(DnsResolution::Ipv6);
    let err = resolver
        .resolve("v4only.zone.test")
        .await
        .expect_err("no AAAA");
    assert!(err.reason.contains("AAAA"), "{}", err.reason);
    assert!(!err.reason.contains("A/AAAA"), "{}", err.reason);
}

/// A name with more addresses than one report entry may carry (300 A
/// records, answered over TCP after the truncated UDP answer): the first
/// `MAX_ADDRESSES_PER_ENTRY` are checked, so the entry the CA receives is
/// one it accepts.
#[tokio::test]
async fn a_name_with_too_many_addresses_is_cut_to_what_one_entry_carries() {
    let ips: Vec<std::net::IpAddr> = (0..300u32)
        .map(|i| std::net::Ipv4Addr::from(0x7f08_0000 + i + 1).into())
        .collect();
    let records: Vec<(&str, std::net::IpAddr)> =
        ips.iter().map(|ip| ("many.zone.test", *ip)).collect();
    let dns = DnsServer::start(([127, 0, 0, 1], 0).into(), "zone.test", &records)
        .await
        .expect("DNS server");
    let resolver = resolver(&dns, Duration::from_secs(1), Duration::ZERO);
    let addresses = resolver.resolve("many.zone.test").await.expect("resolves");
    assert_eq!(addresses.len(), policy::report::MAX_ADDRESSES_PER_ENTRY);
    let distinct: std::collections::HashSet<_> = addresses.iter().collect();
    assert_eq!(distinct.len(), addresses.len(), "no duplicates");
    assert!(addresses.iter().all(|a| ips.contains(a)));
}
