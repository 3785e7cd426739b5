//! Checks of the shipping recipes that CI cannot run (no container engine
//! there): the Containerfile, its example config and `.containerignore`,
//! and that the systemd units, the Debian package metadata and the
//! packaged configs agree (paths, user, state directory, capabilities).
//! `cargo xtask package-test` runs the packages for real.

use std::path::Path;

use crate::root;

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn toml_file(path: &str) -> toml::Table {
    read(path).parse().unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn str_at<'a>(table: &'a toml::Table, section: &str, key: &str) -> &'a str {
    table
        .get(section)
        .and_then(|s| s.get(key))
        .and_then(toml::Value::as_str)
        .unwrap_or_else(|| panic!("no [{section}] {key}"))
}

#[test]
fn container_image_config_listens_everywhere_and_keeps_data_on_the_volume() {
    let config = toml_file("deploy/container/ca.toml");
    for key in ["grpc_listen", "http_listen"] {
        let addr = str_at(&config, "server", key);
        assert!(
            addr.starts_with("0.0.0.0:") || addr.starts_with("[::]:"),
            "deploy/container/ca.toml [server] {key} = {addr}: a container must listen on all interfaces"
        );
    }
    assert_eq!(str_at(&config, "server", "data_dir"), "/var/lib/reach");
    let file = read("deploy/container/Containerfile");
    for needed in [
        "VOLUME /var/lib/reach",
        "COPY deploy/container/ca.toml /etc/reach/ca.toml",
        "USER reach",
        "EXPOSE 7443 7480",
        "ENV REACH_STATE_DIR=/var/lib/reach/",
        "chown -R reach:reach /var/lib/reach",
    ] {
        assert!(file.contains(needed), "Containerfile lacks `{needed}`");
    }
    let ca_run = file
        .lines()
        .find(|l| l.contains("run -d --name reach-ca"))
        .expect("Containerfile documents no CA `run` line");
    for needed in ["-p 7443:7443", "-p 7480:7480", ":/var/lib/reach"] {
        assert!(
            ca_run.contains(needed),
            "the CA run line lacks `{needed}`: {ca_run}"
        );
    }
    let connector_run = file
        .lines()
        .find(|l| l.contains("connector-agent") && l.contains(" run "))
        .expect("Containerfile documents no connector `run` line");
    for needed in [
        ":/var/lib/reach",
        "REACH_CA_CERT=",
        "REACH_CA=",
        "ca.pem:/etc/reach/ca.pem",
    ] {
        assert!(
            connector_run.contains(needed),
            "the connector run line lacks `{needed}`: {connector_run}"
        );
    }
}

#[test]
fn container_context_leaves_out_build_output_and_history() {
    let ignore = read(".containerignore");
    let lines: Vec<&str> = ignore.lines().map(str::trim).collect();
    for needed in ["target/", ".git/"] {
        assert!(lines.contains(&needed), ".containerignore lacks {needed}");
    }
}

/// The `ExecStart=` binary of a unit, and its other `key=value` lines.
fn unit(path: &str) -> Vec<(String, String)> {
    read(path)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn get<'a>(unit: &'a [(String, String)], key: &str) -> Vec<&'a str> {
    unit.iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .collect()
}

#[test]
fn units_packages_and_packaged_configs_agree() {
    for (bin, unit_file, package, config) in [
        (
            "central-authority",
            "deploy/systemd/reach-central-authority.service",
            "reach-central-authority",
            "deploy/debian/ca.toml",
        ),
        (
            "connector-agent",
            "deploy/systemd/reach-connector-agent.service",
            "reach-connector-agent",
            "deploy/debian/connector.env",
        ),
    ] {
        let u = unit(unit_file);
        assert_eq!(get(&u, "User"), ["reach"], "{unit_file}");
        assert_eq!(get(&u, "StateDirectory"), ["reach"], "{unit_file}");
        let exec = get(&u, "ExecStart");
        assert!(
            exec.len() == 1 && exec[0].starts_with(&format!("/usr/bin/{bin} ")),
            "{unit_file}: ExecStart {exec:?} is not the package's /usr/bin/{bin}"
        );
        let manifest = toml_file(&format!("crates/{bin}/Cargo.toml"));
        let deb = manifest
            .get("package")
            .and_then(|p| p.get("metadata"))
            .and_then(|m| m.get("deb"))
            .and_then(toml::Value::as_table)
            .unwrap_or_else(|| panic!("crates/{bin}/Cargo.toml has no [package.metadata.deb]"));
        assert_eq!(deb.get("name").and_then(toml::Value::as_str), Some(package));
        let assets: Vec<(String, String)> = deb
            .get("assets")
            .and_then(toml::Value::as_array)
            .expect("assets")
            .iter()
            .filter_map(|a| {
                let a = a.as_array()?;
                Some((
                    a.first()?.as_str()?.to_owned(),
                    a.get(1)?.as_str()?.to_owned(),
                ))
            })
            .collect();
        let has = |from: &str, to: &str| assets.iter().any(|(f, t)| f == from && t == to);
        assert!(
            has(&format!("target/release/{bin}"), "usr/bin/"),
            "{bin}: binary asset"
        );
        assert!(
            has(&format!("../../{unit_file}"), "lib/systemd/system/"),
            "{bin}: unit asset"
        );
        let etc = assets
            .iter()
            .find(|(f, _)| f == &format!("../../{config}"))
            .unwrap_or_else(|| panic!("{bin}: {config} is not packaged"));
        assert!(
            etc.1.starts_with("etc/reach/"),
            "{bin}: {config} goes to {}",
            etc.1
        );
        let scripts = deb
            .get("maintainer-scripts")
            .and_then(toml::Value::as_str)
            .expect("maintainer-scripts");
        let dir = root().join("crates").join(bin).join(scripts);
        for script in ["postinst", "postrm"] {
            let text = std::fs::read_to_string(dir.join(script))
                .unwrap_or_else(|e| panic!("{bin} {script}: {e}"));
            assert!(text.contains("reach"), "{bin} {script}");
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let mode = std::fs::metadata(dir.join(script))
                    .map(|m| m.permissions().mode())
                    .unwrap_or(0);
                assert!(mode & 0o111 != 0, "{bin} {script} is not executable");
            }
        }
        if bin == "connector-agent" {
            assert_eq!(get(&u, "AmbientCapabilities"), ["CAP_NET_RAW"]);
            assert_eq!(
                get(&u, "EnvironmentFile"),
                ["/etc/reach/connector.env"],
                "{unit_file}"
            );
            let env = read(config);
            assert!(env.contains("REACH_STATE_DIR=/var/lib/reach/"), "{config}");
        } else {
            let ca = toml_file(config);
            assert!(
                str_at(&ca, "server", "data_dir").starts_with("/var/lib/reach"),
                "{config}: data_dir outside the unit's StateDirectory"
            );
            assert!(
                exec[0].contains("--config /etc/reach/ca.toml"),
                "{unit_file}: {}",
                exec[0]
            );
        }
    }
    assert!(Path::new(&root().join("LICENSE")).is_file(), "no LICENSE");
}
