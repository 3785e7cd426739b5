//! Checks of the shipping recipes' wiring: the Containerfile, its example
//! config and `.containerignore`; that the systemd units, the Debian package metadata and the packaged
//! configs agree (paths, user, state directory, capabilities); the units'
//! sandbox (`systemd-analyze security --offline=yes` at most 2.5, every
//! directive known); their `Documentation=` among the packages' files; the
//! DEP-5 copyright and compressed man pages; and the maintainer scripts'
//! restart after an upgrade. `cargo xtask package-test` runs the packages
//! and `cargo xtask container-test` the image for real.

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

/// The systemd units the packages install, with their packages.
const UNITS: &[(&str, &str)] = &[
    (
        "deploy/systemd/reach-central-authority.service",
        "central-authority",
    ),
    (
        "deploy/systemd/reach-connector-agent.service",
        "connector-agent",
    ),
];

/// The highest `systemd-analyze security` exposure a unit may have.
const MAX_EXPOSURE: f64 = 2.5;

/// `systemd-analyze ARGS` (from the `systemd` package; it needs no running
/// systemd): its status and output.
fn systemd_analyze(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new("systemd-analyze")
        .args(args)
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| {
            panic!("systemd-analyze is not installed ({e}): `apt-get install systemd` (.ci/run does this)")
        });
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn units_are_sandboxed_to_an_exposure_of_at_most_2_5() {
    for (unit, _) in UNITS {
        let (ok, text) = systemd_analyze(&["security", "--offline=yes", unit]);
        assert!(ok, "systemd-analyze security {unit}:\n{text}");
        let exposure: f64 = text
            .lines()
            .find_map(|l| {
                l.split_once("Overall exposure level for ")?
                    .1
                    .split_once(": ")?
                    .1
                    .split(' ')
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("systemd-analyze security {unit} gave no exposure:\n{text}"));
        assert!(
            exposure <= MAX_EXPOSURE,
            "{unit}: systemd-analyze security --offline=yes scores {exposure}, over {MAX_EXPOSURE}:\n{}",
            text.lines()
                .filter(|l| l.starts_with('✗'))
                .collect::<Vec<_>>()
                .join("\n")
        );
        // Every directive is one systemd knows (a misspelt one is ignored
        // with a warning, and its protection silently missing). The
        // binaries and man pages are checked installed by package-test.
        let (_, text) = systemd_analyze(&["verify", unit]);
        let unknown: Vec<&str> = text
            .lines()
            .filter(|l| {
                !(l.contains("is not executable: No such file or directory")
                    || l.contains("Command 'man "))
            })
            .collect();
        assert!(
            unknown.is_empty(),
            "systemd-analyze verify {unit}:\n{}",
            unknown.join("\n")
        );
    }
}

/// The destination paths of a package's assets, a source glob's `*`
/// standing for any file name: (source, destination) pairs as Cargo.toml
/// gives them.
fn deb_assets(bin: &str) -> Vec<(String, String)> {
    let manifest = toml_file(&format!("crates/{bin}/Cargo.toml"));
    manifest["package"]["metadata"]["deb"]["assets"]
        .as_array()
        .unwrap_or_else(|| panic!("crates/{bin}/Cargo.toml: no [package.metadata.deb] assets"))
        .iter()
        .filter_map(|a| {
            let a = a.as_array()?;
            Some((
                a.first()?.as_str()?.to_owned(),
                a.get(1)?.as_str()?.to_owned(),
            ))
        })
        .collect()
}

/// Whether `name` matches `pattern`, whose `*` stands for any run of
/// characters.
fn glob(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            name.len() >= head.len() + tail.len() && name.starts_with(head) && name.ends_with(tail)
        }
    }
}

/// Whether the assets install `/path`: an asset to exactly that path, or to
/// its directory (a destination ending in `/`) from a source whose file
/// name (or glob) matches.
fn installs(assets: &[(String, String)], path: &str) -> bool {
    let (dir, file) = path.rsplit_once('/').unwrap_or(("", path));
    assets.iter().any(|(from, to)| {
        to == path
            || (to.strip_suffix('/') == Some(dir)
                && from.rsplit('/').next().is_some_and(|f| glob(f, file)))
    })
}

#[test]
fn every_documentation_of_a_unit_is_a_file_its_package_installs() {
    for (unit, bin) in UNITS {
        let paths = crate::debian::documentation_paths(&read(unit))
            .unwrap_or_else(|e| panic!("{unit}: {e:#}"));
        assert!(
            !paths.is_empty(),
            "{unit} has no Documentation= naming a file"
        );
        let assets = deb_assets(bin);
        for path in paths {
            assert!(
                installs(&assets, &path),
                "{unit}: Documentation= names /{path}, which crates/{bin}/Cargo.toml does not install"
            );
        }
    }
}

#[test]
fn packages_carry_debian_copyright_changelog_and_compressed_man_pages() {
    let copyright = read("deploy/debian/copyright");
    for needed in [
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n",
        "\nFiles: *\n",
        "\nLicense: Apache-2.0\n",
        "/usr/share/common-licenses/Apache-2.0",
    ] {
        assert!(
            copyright.contains(needed),
            "deploy/debian/copyright lacks {needed:?}"
        );
    }
    assert!(
        !copyright.contains("TERMS AND CONDITIONS"),
        "deploy/debian/copyright carries the license's full text: point at /usr/share/common-licenses"
    );
    for (_, bin) in UNITS {
        let manifest = toml_file(&format!("crates/{bin}/Cargo.toml"));
        let deb = &manifest["package"]["metadata"]["deb"];
        let package = deb["name"].as_str().expect("name");
        assert!(
            deb.get("license-file").is_none(),
            "{bin}: license-file makes cargo-deb write the full license into the copyright file"
        );
        let assets = deb_assets(bin);
        let doc = format!("usr/share/doc/{package}");
        assert!(
            assets
                .iter()
                .any(|(f, t)| f == "../../deploy/debian/copyright"
                    && *t == format!("{doc}/copyright")),
            "{bin}: deploy/debian/copyright is not /{doc}/copyright"
        );
        assert!(
            installs(&assets, &format!("{doc}/changelog.Debian.gz")),
            "{bin}: no /{doc}/changelog.Debian.gz"
        );
        for (from, to) in &assets {
            if to.starts_with("usr/share/man/") {
                assert!(
                    from.ends_with(".gz"),
                    "{bin}: man page {from} is not gzip-compressed"
                );
            }
        }
    }
}

#[test]
fn postinst_restarts_a_running_unit_after_an_upgrade() {
    for (unit, bin) in UNITS {
        let service = unit.rsplit('/').next().expect("a file name");
        let dir = format!("deploy/debian/{bin}");
        let postinst = read(&format!("{dir}/postinst"));
        // dh_installsystemd's pattern: only with systemd running, and on
        // `configure` from a previous version ($2), a restart of the unit if
        // it runs (deb-systemd-invoke: policy-rc.d is obeyed).
        let systemd = postinst
            .split("if [ -d /run/systemd/system ]; then")
            .nth(1)
            .unwrap_or_else(|| panic!("{dir}/postinst asks systemd nothing"));
        let upgrade = systemd
            .split("if [ -n \"$2\" ]; then")
            .nth(1)
            .unwrap_or_else(|| panic!("{dir}/postinst does nothing different on an upgrade"));
        let restart = format!("deb-systemd-invoke try-restart {service}");
        assert!(
            upgrade
                .split("fi")
                .next()
                .is_some_and(|b| b.contains(&restart)),
            "{dir}/postinst does not `{restart}` on an upgrade"
        );
        let prerm = read(&format!("{dir}/prerm"));
        assert!(
            prerm.contains("[ \"$1\" = remove ]")
                && prerm.contains(&format!("deb-systemd-invoke stop {service}")),
            "{dir}/prerm does not stop {service} on removal"
        );
        for script in ["postinst", "prerm", "postrm"] {
            let status = std::process::Command::new("sh")
                .arg("-n")
                .arg(root().join(&dir).join(script))
                .status()
                .expect("sh");
            assert!(status.success(), "{dir}/{script} is not valid sh");
        }
    }
}
