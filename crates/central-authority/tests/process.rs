//! The real `central-authority` binary in its own process, over loopback:
//! `check-config`, start-up failures, SIGHUP reload and graceful shutdown.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use protocol::v1::authority_message::Kind as Out;
use test_support::free_port;

const BIN: &str = env!("CARGO_BIN_EXE_central-authority");

/// Kills the child if the test fails before it exits.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn check_config_lists_every_error_and_exits_non_zero() {
    let dir = scratch_dir("check");
    // The example, with secrets of one's own in place of its placeholders.
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/examples/ca.toml");
    let own = dir.join("example.toml");
    std::fs::write(
        &own,
        std::fs::read_to_string(example)
            .expect("read the example")
            .replace("change-me", "Wd3kR9vQx2LmZ7pT4nYc8sHb"),
    )
    .expect("write");
    let ok = Command::new(BIN)
        .arg("check-config")
        .arg(&own)
        .output()
        .expect("run");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("OK"));

    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        r#"
[server]
http_listen = "localhost"
[selection]
strategy = "fastest"
[[connector_groups]]
name = "g"
provisioning_key_file = "missing.key"
[[segments]]
name = "big"
applications = ["*.example.test"]
tcp_ports = ["1-11"]
connector_groups = ["g"]
"#,
    )
    .expect("write");
    let out = Command::new(BIN)
        .args(["check-config"])
        .arg(&bad)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "server.http_listen",
        "selection.strategy",
        "provisioning_key_file: cannot read",
        "is not allowed with 11 ports (max 10)",
        "application discovery segment",
    ] {
        assert!(stderr.contains(needle), "{needle:?} missing in:\n{stderr}");
    }
    // Starting with it fails the same way, before binding anything.
    let out = Command::new(BIN)
        .arg("--config")
        .arg(&bad)
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("selection.strategy"));
    let _ = std::fs::remove_dir_all(dir);
}

/// The container image's configuration carries `change-me` secrets: the
/// CA refuses it, in `check-config` and at start (before binding anything),
/// naming the token and the group and the key of each.
#[test]
fn the_images_placeholder_secrets_are_refused_at_check_and_at_start() {
    let image = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/container/ca.toml"
    );
    for args in [&["check-config", image][..], &["--config", image]] {
        let child = Command::new(BIN)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run");
        let mut child = KillOnDrop(child);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.0.try_wait().expect("wait") {
                break status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{args:?} still runs after 20 s: the placeholders were accepted"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(!status.success(), "{args:?} succeeded");
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.0.stderr.take().expect("stderr"), &mut stderr)
            .expect("read stderr");
        for needle in [
            r#"api_tokens "admin": token is a placeholder (it contains "change-me")"#,
            r#"connector_groups "dc-east": provisioning_key is a placeholder (it contains "change-me")"#,
        ] {
            assert!(
                stderr.contains(needle),
                "{args:?}: {needle:?} missing in:\n{stderr}"
            );
        }
    }
}

#[tokio::test]
async fn binary_serves_reloads_on_sighup_and_shuts_down_cleanly() {
    let dir = scratch_dir("proc");
    let path = dir.join("ca.toml");
    let (grpc, http) = (free_port().expect("port"), free_port().expect("port"));
    let config = |extra: &str| {
        config_text("", "discovery_timeout_ms = 400", extra)
            .replace(
                "grpc_listen = \"127.0.0.1:0\"",
                &format!("grpc_listen = \"127.0.0.1:{grpc}\""),
            )
            .replace(
                "http_listen = \"127.0.0.1:1\"",
                &format!("http_listen = \"127.0.0.1:{http}\""),
            )
            // Only SIGHUP triggers a reload in this test.
            .replace("reload_poll_ms = 50", "reload_poll_ms = 600000")
    };
    std::fs::write(&path, config("")).expect("write");
    let mut child = KillOnDrop(
        Command::new(BIN)
            .arg("--config")
            .arg(&path)
            .args(["--log-format", "json"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn"),
    );
    let pid = child.0.id().to_string();

    let root_path = dir.join("reach-ca-data").join("ca.pem");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if root_path.exists()
            && tokio::net::TcpStream::connect(("127.0.0.1", http))
                .await
                .is_ok()
            && tokio::net::TcpStream::connect(("127.0.0.1", grpc))
                .await
                .is_ok()
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "CA did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The CA generated its root in its data directory (next to the config).
    let root = std::fs::read_to_string(&root_path).expect("root");
    let web = Http::new(format!("127.0.0.1:{http}").parse().expect("addr"), &root);
    assert_eq!(web.send("GET", "/healthz", None, None).await.0, 200);

    let target = Target {
        grpc: format!("127.0.0.1:{grpc}").parse().expect("addr"),
        root,
    };
    let mut east = open(&target, "east-1", "dc-east", KEY_EAST)
        .await
        .expect("authenticated");
    assert!(matches!(east.next().await, Some(Out::Welcome(_))));
    east.trust_bundle().await;

    std::fs::write(
        &path,
        config(
            &segment("added")
                .apps(["added.test.reach"])
                .tcp(["80"])
                .mode("none")
                .groups(["dc-east"])
                .toml(),
        ),
    )
    .expect("write");
    let status = Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .expect("kill");
    assert!(status.success());
    match east.next().await {
        Some(Out::PolicyUpdate(u)) => assert!(u.segments.iter().any(|s| s.name == "added")),
        other => panic!("expected PolicyUpdate, got {other:?}"),
    }
    let (s, v) = web.access("added.test.reach", "tcp", 80).await;
    assert_eq!((s, v["connector"].as_str()), (200, Some("east-1")), "{v}");

    // SIGTERM: connectors are told, and the process exits 0.
    let status = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(status.success());
    match east.next().await {
        Some(Out::Shutdown(s)) => assert!(s.reason.contains("shutting down")),
        other => panic!("expected Shutdown, got {other:?}"),
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let exit = loop {
        if let Some(exit) = child.0.try_wait().expect("wait") {
            break exit;
        }
        assert!(tokio::time::Instant::now() < deadline, "CA did not exit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(exit.success(), "{exit:?}");
    let mut logs = String::new();
    if let Some(mut err) = child.0.stderr.take() {
        use std::io::Read;
        let _ = err.read_to_string(&mut logs);
    }
    assert!(logs.contains("configuration reloaded"), "{logs}");
    assert!(logs.contains("\"trigger\":\"SIGHUP\""), "{logs}");
    assert!(!logs.contains(KEY_EAST), "a provisioning key was logged");
    let _ = std::fs::remove_dir_all(dir);
}
