//! `central-authority new-root --out DIR`: a new issuing root for a root
//! rotation, made as the CA makes its first one (`pki::generate_root`):
//! `DIR/ca.pem` and `DIR/ca.key` (the directory 0700, the files 0600),
//! never over an existing file.

use std::path::{Path, PathBuf};

use crate::credentials::pki::{PkiError, ROOT_CERT_FILE, ROOT_KEY_FILE};

/// What `new-root` wrote.
#[derive(Debug)]
pub struct NewRoot {
    /// The certificate (what connectors trust).
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
    /// SHA-256 of the certificate (DER), as `GET /api/v1/root` names it.
    pub fingerprint: String,
}

/// Makes a root and writes it into `out` (created if need be); refuses
/// when either file exists there already.
pub fn run(out: &Path) -> Result<NewRoot, PkiError> {
    let (cert, key) = (out.join(ROOT_CERT_FILE), out.join(ROOT_KEY_FILE));
    for path in [&cert, &key] {
        if path.exists() {
            return Err(PkiError::Io {
                path: path.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "exists already; new-root never overwrites a root",
                ),
            });
        }
    }
    private_files::create_private_dir(out).map_err(|source| PkiError::Io {
        path: out.to_owned(),
        source,
    })?;
    let (cert_pem, key_pem) = crate::credentials::pki::generate_root()?;
    // Key first: a crash in between leaves no certificate without key.
    crate::credentials::pki::write_atomic(&key, &key_pem)?;
    crate::credentials::pki::write_atomic(&cert, &cert_pem)?;
    let fingerprint = crate::credentials::pki::pem_fingerprint(&cert_pem).unwrap_or_default();
    Ok(NewRoot {
        cert,
        key,
        fingerprint,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_new_root_is_written_once_and_never_over_another() {
        let dir = std::env::temp_dir().join(format!("reach-new-root-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let made = super::run(&dir).expect("made");
        let pem = std::fs::read_to_string(&made.cert).expect("cert");
        assert_eq!(
            crate::credentials::pki::pem_fingerprint(&pem).as_deref(),
            Some(made.fingerprint.as_str())
        );
        assert_eq!(made.fingerprint.len(), 64);
        let again = super::run(&dir).expect_err("refused");
        assert!(again.to_string().contains("never overwrites"), "{again}");
        assert_eq!(std::fs::read_to_string(&made.cert).expect("cert"), pem);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
