//! Files only their owner may read, written so that a crash leaves either
//! the old or the new content: the CA's keys, certificates and data
//! directory, and the connector's key and certificate. One implementation
//! for both binaries (they had a copy each).
//!
//! **Invariant:** a file is never written in place and never through a
//! name someone else could have planted: the content goes to a fresh,
//! uniquely named temporary file opened with `create_new` (a planted file
//! or symlink is refused, not followed) and mode 0600 (0640 for a public
//! file its group may read), is synced, renamed
//! over the target, and the directory is synced so the rename survives a
//! crash.

#![forbid(unsafe_code)]

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `text` to `path` atomically and durably, readable by its owner
/// only (see the crate's invariant). On failure the temporary file is
/// removed and the target is left as it was.
pub fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    write_atomic_mode(path, text, 0o600)
}

/// [`write_atomic`] of a public file (a certificate) that its group may
/// read too: mode 0640 whatever the umask, the group the directory gives
/// (a set-group-ID directory's own).
pub fn write_atomic_group_readable(path: &Path, text: &str) -> std::io::Result<()> {
    write_atomic_mode(path, text, 0o640)
}

fn write_atomic_mode(path: &Path, text: &str, mode: u32) -> std::io::Result<()> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let tmp = dir.join(format!(
        ".{}.{}.{}.{:016x}.tmp",
        path.file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        rand::random::<u64>(),
    ));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let written = (|| {
        let mut f = options.open(&tmp)?;
        #[cfg(unix)]
        if mode != 0o600 {
            use std::os::unix::fs::PermissionsExt;
            f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        }
        #[cfg(not(unix))]
        let _ = mode;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    // The rename is durable only once the directory entry is.
    #[cfg(unix)]
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

/// Creates `dir` (and missing parents) with mode 0700.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)
}

/// A warning when the secret file at `path` is readable by others or
/// writable by anyone but its owner (`None` when it is not, or cannot be
/// inspected). Its group may read it: a secret shared with the group an
/// operator chose (the Debian package's `reach-admin` reads the admin
/// token).
pub fn loose_permissions(path: &Path) -> Option<String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
        (mode & 0o027 != 0).then(|| {
            format!(
                "secret file {} is readable by others or writable by group or others (mode {mode:04o}); chmod 600 it (640 to share it with its group)",
                path.display()
            )
        })
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("reach-private-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        create_private_dir(&dir).expect("dir");
        dir
    }

    #[cfg(unix)]
    #[test]
    fn files_and_directories_are_the_owners_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch("modes");
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        let file = dir.join("key.pem");
        write_atomic(&file, "one").expect("written");
        assert_eq!(mode(&file), 0o600);
        assert_eq!(loose_permissions(&file), None);
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let warning = loose_permissions(&file).expect("a warning");
        assert!(warning.contains("mode 0644"), "{warning}");
        for (shared, warned) in [(0o640, false), (0o440, false), (0o660, true), (0o604, true)] {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(shared))
                .expect("chmod");
            assert_eq!(loose_permissions(&file).is_some(), warned, "{shared:o}");
        }
        // A public file for the group: 0640 whatever the umask.
        let public = dir.join("ca.pem");
        write_atomic_group_readable(&public, "cert").expect("written");
        assert_eq!(mode(&public), 0o640);
        // Rewritten: the new file is 0600 again, whatever the old one was.
        write_atomic(&file, "two").expect("rewritten");
        assert_eq!(std::fs::read_to_string(&file).expect("read"), "two");
        assert_eq!(mode(&file), 0o600);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_failed_write_leaves_the_target_and_no_temporary_file() {
        let dir = scratch("fail");
        let file = dir.join("cert.pem");
        write_atomic(&file, "old").expect("written");
        // A directory where the file should go: the rename fails.
        let blocked = dir.join("blocked");
        std::fs::create_dir(&blocked).expect("dir");
        std::fs::write(blocked.join("x"), "x").expect("fill");
        assert!(write_atomic(&blocked, "new").is_err());
        assert_eq!(std::fs::read_to_string(&file).expect("read"), "old");
        let names: Vec<String> = std::fs::read_dir(&dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!names.iter().any(|n| n.ends_with(".tmp")), "{names:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
