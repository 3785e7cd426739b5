//! `package-test`'s administrator without root: the book's install page
//! has them join the `reach-admin` group the CA package makes
//! (`adduser USER reach-admin`); then `central-authority api` with the
//! packaged token and the CA's root works for them, while a user outside
//! the group can read neither, and nobody but the CA reads the
//! provisioning key.

use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use super::{TestHost, installed, output};

/// The group the CA package makes.
pub const GROUP: &str = "reach-admin";
/// The test's administrator, added to [`GROUP`].
pub const ADMIN: &str = "reach-pt-admin";
/// The test's other user, in no reach group.
pub const OTHER: &str = "reach-pt-other";

const TOKEN: &str = "/etc/reach/secrets/api.token";
const KEY: &str = "/etc/reach/secrets/default.key";
const ROOT: &str = "/var/lib/reach/ca/ca.pem";

/// The test's users, removed when dropped (with their group memberships).
struct Users;

impl Drop for Users {
    fn drop(&mut self) {
        for user in [ADMIN, OTHER] {
            let _ = Command::new("userdel")
                .arg(user)
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// `program args` on `host` as `user` (its groups from the group file).
fn as_user(host: &TestHost, user: &str, program: &str, args: &[&str]) -> Result<(bool, String)> {
    let mut cmd = host.command("setpriv");
    cmd.arg(format!("--reuid={user}"))
        .arg(format!("--regid={user}"))
        .arg("--init-groups")
        .arg("--")
        .arg(program)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .current_dir("/")
        .stdin(Stdio::null());
    let out = cmd
        .output()
        .with_context(|| format!("running {program} as {user}"))?;
    Ok((
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}

/// The packaged token and root serve an administrator in [`GROUP`] on
/// `host`, asking the CA's API at `api`; a user outside it is refused the
/// token; `expect` is a word the connectors' list must show.
pub fn check(host: &TestHost, api: &str, expect: &str) -> Result<()> {
    if !installed("adduser", "--version") {
        bail!("adduser is not installed (package adduser): the book's install page uses it");
    }
    let _users = Users;
    for user in [ADMIN, OTHER] {
        let mut add = Command::new("useradd");
        add.args(["--system", "--user-group", "--no-create-home"])
            .args(["--shell", "/usr/sbin/nologin", user]);
        output(add, &format!("useradd {user}"))?;
    }
    // As the install page says.
    let mut join = Command::new("adduser");
    join.args([ADMIN, GROUP]);
    output(join, &format!("adduser {ADMIN} {GROUP}"))?;
    for path in [TOKEN, ROOT] {
        let meta = std::fs::metadata(path).with_context(|| format!("{path} is missing"))?;
        let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777;
        if mode != 0o640 {
            bail!("{path} has mode {mode:04o}, not 0640 (read by {GROUP})");
        }
    }
    let api_args = [
        "api",
        "--url",
        api,
        "--ca-cert",
        ROOT,
        "--token-file",
        TOKEN,
        "connectors",
    ];
    let (ok, said) = as_user(host, ADMIN, "/usr/bin/central-authority", &api_args)?;
    if !ok || !said.contains(expect) {
        bail!("`central-authority api … connectors` as {ADMIN} (in {GROUP}) failed:\n{said}");
    }
    let (ok, said) = as_user(host, OTHER, "/usr/bin/central-authority", &api_args)?;
    if ok {
        bail!("`central-authority api` as {OTHER} (not in {GROUP}) succeeded:\n{said}");
    }
    for (user, file) in [(OTHER, TOKEN), (OTHER, ROOT), (ADMIN, KEY), (OTHER, KEY)] {
        let (ok, said) = as_user(host, user, "head", &["-c", "1", file])?;
        if ok {
            bail!("{user} can read {file}: {said}");
        }
    }
    eprintln!(
        "xtask: package-test: {ADMIN} (in {GROUP}) ran `central-authority api` with the packaged token and root; {OTHER} cannot read the token or the root, neither reads the provisioning key"
    );
    Ok(())
}
