//! The wiring of `deploy/kubernetes`, which the schema check
//! (`cargo xtask manifests`) cannot see: connectors dial the headless
//! Service that resolves to every CA replica; readiness probes `/readyz`,
//! liveness `/livez`; every Deployment runs at least two replicas under a
//! PodDisruptionBudget; every file the CA's config reads is mounted from a
//! Secret that holds it; and the config in the ConfigMap passes
//! `central-authority check-config` (its files made from the placeholder
//! Secrets, under a scratch root).

use std::path::{Path, PathBuf};

use serde_norway::Value;

use crate::root;

/// Every document of every manifest in `deploy/kubernetes`.
fn documents() -> Vec<Value> {
    let dir = root().join("deploy/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in {}", dir.display());
    let mut docs = Vec::new();
    for file in files {
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for doc in serde_norway::Deserializer::from_str(&text) {
            let v: Value = serde::Deserialize::deserialize(doc)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            if !v.is_null() {
                docs.push(v);
            }
        }
    }
    docs
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

/// The one Deployment whose containers run `program`, and that container.
fn deployment_running<'a>(docs: &'a [Value], program: &str) -> (&'a Value, &'a Value) {
    let found: Vec<_> = kind(docs, "Deployment")
        .into_iter()
        .flat_map(|d| {
            seq(&d["spec"]["template"]["spec"]["containers"])
                .iter()
                .map(move |c| (d, c))
        })
        .filter(|(_, c)| seq(&c["args"]).first().is_some_and(|a| a == program))
        .collect();
    assert_eq!(found.len(), 1, "one Deployment runs {program}");
    found[0]
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
    let (ca, _) = deployment_running(&docs, "central-authority");
    let ca_labels = &ca["spec"]["template"]["metadata"]["labels"];
    let (_, connector) = deployment_running(&docs, "connector-agent");
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
    let (_, ca) = deployment_running(&docs, "central-authority");
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
fn every_deployment_runs_two_replicas_under_a_disruption_budget() {
    let docs = documents();
    let budgets = kind(&docs, "PodDisruptionBudget");
    for d in kind(&docs, "Deployment") {
        let replicas = d["spec"]["replicas"].as_u64().unwrap_or(1);
        assert!(
            replicas >= 2,
            "Deployment {} runs {replicas} replica(s)",
            name(d)
        );
        let labels = &d["spec"]["template"]["metadata"]["labels"];
        let budget = budgets
            .iter()
            .find(|b| selects(&b["spec"]["selector"]["matchLabels"], labels))
            .unwrap_or_else(|| panic!("no PodDisruptionBudget selects Deployment {}", name(d)));
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
    let (deployment, _) = deployment_running(docs, "central-authority");
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
    let (deployment, container) = deployment_running(docs, "central-authority");
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
            format!("stand-in-for-{secret}-{key}-0123456789abcdef\n"),
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
