//! The wiring of `deploy/kubernetes`, which the schema check
//! (`cargo xtask manifests`) cannot see: connectors dial the headless
//! Service that resolves to every CA replica; readiness probes `/readyz`,
//! liveness `/livez`; every workload runs at least two replicas under a
//! PodDisruptionBudget; connectors are a StatefulSet whose state directory
//! is a volume claim template (stable names, enrolled once); every object is
//! in the `reach` Namespace (created by the file applied first) and every
//! `*.svc.cluster.local` name is a Service of it; NetworkPolicies open
//! exactly the containers' ports (gRPC to connectors, HTTPS to users,
//! metrics to Prometheus); `deploy/prometheus/prometheus.yml` scrapes every
//! pod through a headless Service's DNS records; every file the CA's config
//! reads is mounted from a Secret that holds it; and the config in the
//! ConfigMap passes `central-authority check-config` (its files made from
//! the placeholder Secrets, under a scratch root).

use std::path::{Path, PathBuf};

use serde_norway::Value;

use crate::root;

/// The namespace every object of `deploy/kubernetes` lives in, which the
/// `*.reach.svc.cluster.local` names in them name.
const NAMESPACE: &str = "reach";

/// The manifests in `deploy/kubernetes`, in the order `kubectl apply -f`
/// takes a directory's files (by name).
fn manifest_files() -> Vec<PathBuf> {
    let dir = root().join("deploy/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in {}", dir.display());
    files
}

/// Every document of one manifest file.
fn documents_of(file: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let mut docs = Vec::new();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let v: Value = serde::Deserialize::deserialize(doc)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        if !v.is_null() {
            docs.push(v);
        }
    }
    docs
}

/// Every document of every manifest in `deploy/kubernetes`.
fn documents() -> Vec<Value> {
    manifest_files()
        .iter()
        .flat_map(|f| documents_of(f))
        .collect()
}

fn kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn name(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or("?")
}

fn named<'a>(docs: &'a [Value], k: &str, n: &str) -> &'a Value {
    kind(docs, k)
        .into_iter()
        .find(|d| name(d) == n)
        .unwrap_or_else(|| panic!("no {k} {n:?} in deploy/kubernetes"))
}

fn seq(v: &Value) -> &[Value] {
    v.as_sequence().map_or(&[], Vec::as_slice)
}

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// Whether `labels` match every entry of `selector`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector
        .as_mapping()
        .is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| &labels[k] == v))
}

/// The workloads: every Deployment and StatefulSet.
fn workloads(docs: &[Value]) -> Vec<&Value> {
    docs.iter()
        .filter(|d| d["kind"] == "Deployment" || d["kind"] == "StatefulSet")
        .collect()
}

/// The one workload whose containers run `program`, and that container.
fn workload_running<'a>(docs: &'a [Value], program: &str) -> (&'a Value, &'a Value) {
    let found: Vec<_> = workloads(docs)
        .into_iter()
        .flat_map(|d| {
            seq(&d["spec"]["template"]["spec"]["containers"])
                .iter()
                .map(move |c| (d, c))
        })
        .filter(|(_, c)| seq(&c["args"]).first().is_some_and(|a| a == program))
        .collect();
    assert_eq!(found.len(), 1, "one workload runs {program}");
    found[0]
}

/// The labels of a workload's pods.
fn pod_labels(workload: &Value) -> &Value {
    &workload["spec"]["template"]["metadata"]["labels"]
}

/// The container's environment variable `var`.
fn env<'a>(container: &'a Value, var: &str) -> &'a str {
    seq(&container["env"])
        .iter()
        .find(|e| e["name"] == var)
        .map(|e| str_of(&e["value"]))
        .unwrap_or_else(|| panic!("the container sets no {var}"))
}

/// The host of each comma-separated URL in `urls`.
fn hosts(urls: &str) -> Vec<&str> {
    urls.split(',')
        .map(|u| {
            let rest = u.trim().split_once("://").map_or(u, |(_, r)| r);
            let authority = rest.split('/').next().unwrap_or(rest);
            authority.rsplit_once(':').map_or(authority, |(h, _)| h)
        })
        .collect()
}

#[test]
fn connectors_dial_the_headless_service_of_every_ca_replica() {
    let docs = documents();
    let (ca, _) = workload_running(&docs, "central-authority");
    let ca_labels = &ca["spec"]["template"]["metadata"]["labels"];
    let (_, connector) = workload_running(&docs, "connector-agent");
    let dialled = env(connector, "REACH_CA");
    for host in hosts(dialled) {
        let service_name = host.split('.').next().unwrap_or(host);
        let service = named(&docs, "Service", service_name);
        assert_eq!(
            service["spec"]["clusterIP"], "None",
            "connectors dial {host}: Service {service_name} is not headless, so its name resolves to one virtual address and a connector gets one session to one replica; dial the headless Service"
        );
        assert!(
            selects(&service["spec"]["selector"], ca_labels),
            "Service {service_name} does not select the CA's pods"
        );
        assert_eq!(
            service["spec"]["publishNotReadyAddresses"], true,
            "Service {service_name}: a connector must reach a replica that is warming up (it waits for the connectors' reports)"
        );
        // The CA's certificate must name what the connector verifies.
        let config = ca_config(&docs);
        let names: Vec<&str> = config["tls"]["server_names"]
            .as_array()
            .map(|a| a.iter().filter_map(toml::Value::as_str).collect())
            .unwrap_or_default();
        assert!(
            names.contains(&host),
            "connectors dial {host}, which the CA's [tls] server_names {names:?} lack"
        );
    }
}

#[test]
fn probes_are_readyz_and_livez() {
    let docs = documents();
    let (_, ca) = workload_running(&docs, "central-authority");
    assert_eq!(
        ca["readinessProbe"]["httpGet"]["path"], "/readyz",
        "the CA's readiness probe: {:?}",
        ca["readinessProbe"]
    );
    assert_eq!(
        ca["livenessProbe"]["httpGet"]["path"], "/livez",
        "the CA's liveness probe: {:?}",
        ca["livenessProbe"]
    );
    for probe in ["readinessProbe", "livenessProbe"] {
        let port = &ca[probe]["httpGet"]["port"];
        assert!(
            seq(&ca["ports"])
                .iter()
                .any(|p| &p["name"] == port || &p["containerPort"] == port),
            "{probe} port {port:?} is not one the container declares"
        );
    }
}

#[test]
fn every_workload_runs_two_replicas_under_a_disruption_budget() {
    let docs = documents();
    let budgets = kind(&docs, "PodDisruptionBudget");
    for d in workloads(&docs) {
        let replicas = d["spec"]["replicas"].as_u64().unwrap_or(1);
        assert!(
            replicas >= 2,
            "{} {} runs {replicas} replica(s)",
            str_of(&d["kind"]),
            name(d)
        );
        let labels = pod_labels(d);
        let budget = budgets
            .iter()
            .find(|b| selects(&b["spec"]["selector"]["matchLabels"], labels))
            .unwrap_or_else(|| panic!("no PodDisruptionBudget selects {}", name(d)));
        let keeps = budget["spec"]["minAvailable"].as_u64();
        let loses = budget["spec"]["maxUnavailable"].as_u64();
        assert!(
            keeps.is_some_and(|k| k >= 1 && k < replicas)
                || loses.is_some_and(|l| l >= 1 && l < replicas),
            "PodDisruptionBudget {} must keep at least one pod of {} and let a drain proceed",
            name(budget),
            name(d)
        );
    }
}

/// The CA's `ca.toml` from the ConfigMap its Deployment mounts.
fn ca_config(docs: &[Value]) -> toml::Table {
    config_text(docs)
        .parse()
        .unwrap_or_else(|e| panic!("the ConfigMap's ca.toml: {e}"))
}

fn config_text(docs: &[Value]) -> String {
    let (deployment, _) = workload_running(docs, "central-authority");
    let map = seq(&deployment["spec"]["template"]["spec"]["volumes"])
        .iter()
        .find_map(|v| v["configMap"]["name"].as_str())
        .expect("the CA mounts a ConfigMap");
    str_of(&named(docs, "ConfigMap", map)["data"]["ca.toml"]).to_owned()
}

/// Every file the config reads: `*_file` keys anywhere, and the store
/// URL's `sslrootcert`.
fn files_read(config: &toml::Table) -> Vec<String> {
    fn walk(v: &toml::Value, out: &mut Vec<String>) {
        match v {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    match v.as_str() {
                        Some(s) if k.ends_with("_file") => out.push(s.to_owned()),
                        Some(s) if k == "url" => out.extend(
                            s.split(['?', '&'])
                                .filter_map(|p| p.strip_prefix("sslrootcert="))
                                .map(str::to_owned),
                        ),
                        _ => walk(v, out),
                    }
                }
            }
            toml::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(&toml::Value::Table(config.clone()), &mut out);
    out
}

/// Where each file the config reads comes from: (path, Secret, key).
fn secret_sources(docs: &[Value]) -> Vec<(String, String, String)> {
    let (deployment, container) = workload_running(docs, "central-authority");
    let volumes = seq(&deployment["spec"]["template"]["spec"]["volumes"]);
    let mut out = Vec::new();
    for path in files_read(&ca_config(docs)) {
        let mount = seq(&container["volumeMounts"])
            .iter()
            .find(|m| {
                let at = str_of(&m["mountPath"]);
                m["subPath"].is_null() && Path::new(&path).parent() == Some(Path::new(at))
            })
            .unwrap_or_else(|| {
                panic!("the config reads {path}, but no volume is mounted at its directory")
            });
        let volume = volumes
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap_or_else(|| panic!("volume {:?} is mounted but not declared", mount["name"]));
        let secret = volume["secret"]["secretName"].as_str().unwrap_or_else(|| {
            panic!(
                "{path} is mounted from volume {:?}, not a Secret",
                mount["name"]
            )
        });
        let key = Path::new(&path)
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or_default()
            .to_owned();
        out.push((path, secret.to_owned(), key));
    }
    out
}

#[test]
fn every_file_the_config_reads_is_a_key_of_a_mounted_secret() {
    let docs = documents();
    let sources = secret_sources(&docs);
    assert!(sources.len() >= 4, "the config reads files: {sources:?}");
    for (path, secret, key) in sources {
        let s = named(&docs, "Secret", &secret);
        assert!(
            !s["stringData"][key.as_str()].is_null(),
            "the config reads {path}, from Secret {secret}, whose placeholder has no key {key:?}"
        );
    }
}

#[test]
fn the_configmap_passes_check_config() {
    let docs = documents();
    let scratch = root().join("target/xtask-manifests");
    let _ = std::fs::remove_dir_all(&scratch);
    // Each file where the config reads it, under the scratch root, with a
    // stand-in for the placeholder (long enough to count as a secret).
    for (path, secret, key) in secret_sources(&docs) {
        let at = scratch.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(at.parent().expect("a directory")).expect("scratch directory");
        std::fs::write(
            &at,
            format!("stand-in-for-{secret}-{key}-EPHdus4dS4b2hqY4nP466TOp\n"),
        )
        .expect("write a stand-in");
    }
    let text = config_text(&docs)
        .replace(
            "\"/etc/reach/",
            &format!("\"{}/etc/reach/", scratch.display()),
        )
        .replace(
            "sslrootcert=/etc/reach/",
            &format!("sslrootcert={}/etc/reach/", scratch.display()),
        );
    let config = scratch.join("ca.toml");
    std::fs::write(&config, text).expect("write ca.toml");
    let out = crate::cargo()
        .args([
            "run",
            "--quiet",
            "-p",
            "central-authority",
            "--bin",
            "central-authority",
            "--",
            "check-config",
        ])
        .arg(&config)
        .output()
        .expect("cargo run central-authority");
    assert!(
        out.status.success(),
        "central-authority check-config fails on the ConfigMap's ca.toml:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn connectors_are_a_statefulset_that_keeps_its_state_on_a_claim() {
    let docs = documents();
    let (set, connector) = workload_running(&docs, "connector-agent");
    assert_eq!(
        set["kind"],
        "StatefulSet",
        "connectors run as {:?} {}: a Deployment's pod gets a new name and an empty state volume at every restart, so each restart enrolls a new connector (using one of the key's max_uses) and leaves a stale name the CA waits for at warm-up",
        set["kind"],
        name(set)
    );
    // REACH_NAME is the pod's name, which a StatefulSet keeps (`<set>-0`, …).
    let name_from = seq(&connector["env"])
        .iter()
        .find(|e| e["name"] == "REACH_NAME")
        .map(|e| str_of(&e["valueFrom"]["fieldRef"]["fieldPath"]));
    assert_eq!(
        name_from,
        Some("metadata.name"),
        "REACH_NAME is not the pod's stable name"
    );
    let service_name = str_of(&set["spec"]["serviceName"]);
    let service = named(&docs, "Service", service_name);
    assert_eq!(
        service["spec"]["clusterIP"],
        "None",
        "StatefulSet {}'s serviceName {service_name} is not a headless Service",
        name(set)
    );
    assert!(
        selects(&service["spec"]["selector"], pod_labels(set)),
        "Service {service_name} does not select StatefulSet {}'s pods",
        name(set)
    );
    // The state directory is a claim of its own per pod, kept across restarts.
    let state_dir = env(connector, "REACH_STATE_DIR").trim_end_matches('/');
    let mount = seq(&connector["volumeMounts"])
        .iter()
        .find(|m| str_of(&m["mountPath"]).trim_end_matches('/') == state_dir)
        .unwrap_or_else(|| panic!("nothing is mounted at REACH_STATE_DIR {state_dir}"));
    assert_ne!(mount["readOnly"], true, "{state_dir} is mounted read-only");
    let claim = seq(&set["spec"]["volumeClaimTemplates"])
        .iter()
        .find(|c| c["metadata"]["name"] == mount["name"])
        .unwrap_or_else(|| {
            panic!(
                "REACH_STATE_DIR {state_dir} is volume {:?}, not one of the volumeClaimTemplates: the enrollment goes with the pod",
                mount["name"]
            )
        });
    assert!(
        seq(&claim["spec"]["accessModes"])
            .iter()
            .any(|m| m == "ReadWriteOnce"),
        "claim {:?}: {:?}",
        mount["name"],
        claim["spec"]["accessModes"]
    );
    assert!(
        !seq(&set["spec"]["template"]["spec"]["volumes"])
            .iter()
            .any(|v| v["name"] == mount["name"]),
        "a pod volume named {:?} shadows the claim",
        mount["name"]
    );
    // A new claim's root belongs to root: the pod's group must own it for
    // the connector (not root) to write there.
    assert!(
        set["spec"]["template"]["spec"]["securityContext"]["fsGroup"]
            .as_u64()
            .is_some(),
        "StatefulSet {} sets no fsGroup: the connector cannot write its claim",
        name(set)
    );
}

/// Kinds that live in no namespace.
const CLUSTER_SCOPED: &[&str] = &[
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "PersistentVolume",
    "StorageClass",
];

/// Every `….svc.cluster.local` name in `v`'s strings (keys included).
fn cluster_names(v: &Value, out: &mut Vec<String>) {
    const SUFFIX: &str = ".svc.cluster.local";
    match v {
        Value::String(s) => {
            let mut rest = s.as_str();
            while let Some(at) = rest.find(SUFFIX) {
                let before = &rest[..at];
                let start = before
                    .char_indices()
                    .rev()
                    .find(|(_, c)| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '.'))
                    .map_or(0, |(i, c)| i + c.len_utf8());
                out.push(rest[start..at + SUFFIX.len()].to_owned());
                rest = &rest[at + SUFFIX.len()..];
            }
        }
        Value::Sequence(items) => items.iter().for_each(|i| cluster_names(i, out)),
        Value::Mapping(m) => m.iter().for_each(|(k, v)| {
            cluster_names(k, out);
            cluster_names(v, out);
        }),
        Value::Tagged(t) => cluster_names(&t.value, out),
        _ => {}
    }
}

#[test]
fn every_object_is_in_the_reach_namespace_and_every_cluster_name_resolves() {
    let files = manifest_files();
    let first = documents_of(&files[0]);
    assert!(
        first
            .iter()
            .any(|d| d["kind"] == "Namespace" && name(d) == NAMESPACE),
        "{} (the first file `kubectl apply -f deploy/kubernetes/` applies) does not create Namespace {NAMESPACE}: the objects of the other files would have no namespace to go to",
        files[0].display()
    );
    let docs = documents();
    for d in &docs {
        if CLUSTER_SCOPED.iter().any(|k| d["kind"] == *k) {
            continue;
        }
        assert_eq!(
            d["metadata"]["namespace"],
            NAMESPACE,
            "{} {} is not in namespace {NAMESPACE}: the names *.{NAMESPACE}.svc.cluster.local would not find it",
            str_of(&d["kind"]),
            name(d)
        );
    }
    let mut names = Vec::new();
    for d in &docs {
        cluster_names(d, &mut names);
    }
    assert!(
        !names.is_empty(),
        "no *.svc.cluster.local name in the manifests"
    );
    for host in names {
        let labels: Vec<&str> = host
            .trim_end_matches(".svc.cluster.local")
            .split('.')
            .collect();
        let [.., service, namespace] = labels.as_slice() else {
            panic!("{host} names no Service and namespace");
        };
        assert_eq!(
            *namespace, NAMESPACE,
            "{host} is in namespace {namespace}, the manifests' objects in {NAMESPACE}"
        );
        assert!(
            kind(&docs, "Service").iter().any(|s| name(s) == *service),
            "{host} names Service {service}, which the manifests do not define: the name does not resolve"
        );
    }
}

/// The named or numbered ports every container of `workload` declares.
fn declared_ports(workload: &Value) -> Vec<(&str, u64)> {
    seq(&workload["spec"]["template"]["spec"]["containers"])
        .iter()
        .flat_map(|c| seq(&c["ports"]))
        .map(|p| (str_of(&p["name"]), p["containerPort"].as_u64().unwrap_or(0)))
        .collect()
}

/// Each port the NetworkPolicies selecting `workload`'s pods open to it, by
/// the declared port's name, with the peers of its rule (`from`; empty:
/// from anywhere).
fn opened_ports<'a>(docs: &'a [Value], workload: &'a Value) -> Vec<(&'a str, &'a [Value])> {
    let declared = declared_ports(workload);
    let mut opened = Vec::new();
    let policies: Vec<_> = kind(docs, "NetworkPolicy")
        .into_iter()
        .filter(|p| {
            selects(
                &p["spec"]["podSelector"]["matchLabels"],
                pod_labels(workload),
            )
        })
        .collect();
    assert!(
        !policies.is_empty(),
        "no NetworkPolicy selects the pods of {}: every port of theirs is open to every pod",
        name(workload)
    );
    for policy in policies {
        assert!(
            seq(&policy["spec"]["policyTypes"])
                .iter()
                .any(|t| t == "Ingress"),
            "NetworkPolicy {} does not restrict ingress",
            name(policy)
        );
        for rule in seq(&policy["spec"]["ingress"]) {
            let ports = seq(&rule["ports"]);
            assert!(
                !ports.is_empty(),
                "NetworkPolicy {}: a rule without ports opens every port",
                name(policy)
            );
            for port in ports {
                let (port_name, _) = declared
                    .iter()
                    .find(|(n, number)| {
                        port["port"] == *n || port["port"].as_u64() == Some(*number)
                    })
                    .unwrap_or_else(|| {
                        panic!(
                            "NetworkPolicy {} opens port {:?}, which no container of {} declares",
                            name(policy),
                            port["port"],
                            name(workload)
                        )
                    });
                opened.push((*port_name, seq(&rule["from"])));
            }
        }
    }
    opened
}

/// The peers the policies let reach `port` of `workload`'s pods, each rule's
/// list (empty: from anywhere).
fn peers_of<'a>(opened: &[(&str, &'a [Value])], port: &str) -> Vec<&'a [Value]> {
    opened
        .iter()
        .filter(|(p, _)| *p == port)
        .map(|(_, from)| *from)
        .collect()
}

/// Whether `peer` is Prometheus' pods (a pod selector on its name label,
/// in a namespace the selector names).
fn is_prometheus(peer: &Value) -> bool {
    peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "prometheus"
        && peer["namespaceSelector"]["matchLabels"]
            .as_mapping()
            .is_some_and(|m| !m.is_empty())
}

#[test]
fn network_policies_open_exactly_the_containers_ports_to_their_peers() {
    let docs = documents();
    for w in workloads(&docs) {
        let opened = opened_ports(&docs, w);
        for (port, _) in declared_ports(w) {
            assert!(
                opened.iter().any(|(p, _)| *p == port),
                "{}: port {port} is declared but no NetworkPolicy opens it",
                name(w)
            );
        }
    }
    let (ca, _) = workload_running(&docs, "central-authority");
    let (connectors, _) = workload_running(&docs, "connector-agent");
    let ca_ports = opened_ports(&docs, ca);
    // gRPC: the connectors, nothing else.
    for from in peers_of(&ca_ports, "grpc") {
        assert!(
            !from.is_empty()
                && from.iter().all(|peer| {
                    peer["namespaceSelector"].is_null()
                        && peer["ipBlock"].is_null()
                        && selects(&peer["podSelector"]["matchLabels"], pod_labels(connectors))
                }),
            "the CA's gRPC port is open to {from:?}, not only to the connectors' pods"
        );
    }
    // HTTPS: users (and Prometheus, for /metrics) from anywhere.
    assert!(
        peers_of(&ca_ports, "http").iter().any(|f| f.is_empty()),
        "the CA's HTTPS port is not open to its users"
    );
    // A connector's metrics: Prometheus only.
    let metrics = peers_of(&opened_ports(&docs, connectors), "metrics");
    assert!(
        !metrics.is_empty(),
        "the connectors' metrics port is closed"
    );
    for from in metrics {
        assert!(
            !from.is_empty() && from.iter().all(is_prometheus),
            "the connectors' metrics port is open to {from:?}, not only to Prometheus"
        );
    }
}

/// The Prometheus example config's scrape job `job`.
fn scrape_job<'a>(config: &'a Value, job: &str) -> &'a Value {
    seq(&config["scrape_configs"])
        .iter()
        .find(|s| s["job_name"] == job)
        .unwrap_or_else(|| panic!("prometheus.yml has no job {job}"))
}

/// Checks that the DNS name a scrape job resolves (`type` A with `port`, or
/// SRV `_PORT._tcp.NAME`) is a headless Service of `workload`'s pods, so it
/// yields one target per pod, on the container port named `port`.
fn check_discovers_pods(docs: &[Value], job: &str, sd: &Value, workload: &Value, port: &str) {
    let name = str_of(&sd["names"][0]);
    assert_eq!(seq(&sd["names"]).len(), 1, "job {job}: {sd:?}");
    let number = declared_ports(workload)
        .into_iter()
        .find(|(n, _)| *n == port)
        .map(|(_, number)| number)
        .unwrap_or_else(|| panic!("{} declares no port {port}", self::name(workload)));
    let host = match str_of(&sd["type"]) {
        "A" => {
            assert_eq!(
                sd["port"].as_u64(),
                Some(number),
                "job {job} scrapes port {:?} of {name}, where {} serves metrics on {number}",
                sd["port"],
                self::name(workload)
            );
            name
        }
        "SRV" => {
            let (service_port, host) = name
                .strip_prefix('_')
                .and_then(|n| n.split_once("._tcp."))
                .unwrap_or_else(|| panic!("job {job}: SRV name {name} is not _PORT._tcp.HOST"));
            let service = host.split('.').next().unwrap_or(host);
            let targets = seq(&named(docs, "Service", service)["spec"]["ports"])
                .iter()
                .find(|p| p["name"] == service_port)
                .map(|p| &p["targetPort"])
                .unwrap_or_else(|| {
                    panic!("job {job}: Service {service} has no port {service_port}")
                });
            assert!(
                targets == port || targets.as_u64() == Some(number),
                "job {job}: port {service_port} of Service {service} leads to {targets:?}, not {port}"
            );
            host
        }
        other => panic!("job {job} resolves {name} with DNS type {other:?}"),
    };
    let service_name = host
        .strip_suffix(&format!(".{NAMESPACE}.svc.cluster.local"))
        .unwrap_or_else(|| {
            panic!("job {job} resolves {host}, no Service name of namespace {NAMESPACE}")
        });
    let service = named(docs, "Service", service_name);
    assert_eq!(
        service["spec"]["clusterIP"], "None",
        "job {job} resolves Service {service_name}, whose name is one virtual address, not every pod"
    );
    assert!(
        selects(&service["spec"]["selector"], pod_labels(workload)),
        "job {job} resolves Service {service_name}, which does not select {}'s pods",
        self::name(workload)
    );
}

#[test]
fn prometheus_scrapes_every_pod_on_its_metrics_port() {
    let docs = documents();
    let path = root().join("deploy/prometheus/prometheus.yml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let config: Value =
        serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    for (job, program, port) in [
        ("reach-ca", "central-authority", "http"),
        ("reach-connector", "connector-agent", "metrics"),
    ] {
        let (workload, _) = workload_running(&docs, program);
        let scrape = scrape_job(&config, job);
        assert!(
            scrape["static_configs"].is_null(),
            "job {job} scrapes fixed addresses: a Service address answers from one pod per scrape, so the other replicas go unwatched; discover every pod"
        );
        let sd = seq(&scrape["dns_sd_configs"]);
        assert_eq!(sd.len(), 1, "job {job} discovers no pods: {scrape:?}");
        check_discovers_pods(&docs, job, &sd[0], workload, port);
    }
    // The metrics port Prometheus scrapes on a connector is where it listens.
    let (_, connector) = workload_running(&docs, "connector-agent");
    let listen = env(connector, "REACH_METRICS_LISTEN");
    assert!(
        seq(&connector["ports"])
            .iter()
            .any(|p| p["name"] == "metrics"
                && listen.ends_with(&format!(":{}", p["containerPort"].as_u64().unwrap_or(0)))),
        "the connector listens for metrics on {listen}, not on its `metrics` port"
    );
    // The CA's certificate must carry the name Prometheus verifies.
    let server_name = str_of(&scrape_job(&config, "reach-ca")["tls_config"]["server_name"]);
    let names: Vec<String> = ca_config(&docs)["tls"]["server_names"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|n| n.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    assert!(
        names.iter().any(|n| n == server_name),
        "job reach-ca verifies the name {server_name:?}, which the CA's [tls] server_names {names:?} lack"
    );
}
