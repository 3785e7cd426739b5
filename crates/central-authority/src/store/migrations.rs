//! The schema migrations of both backends: numbered `.sql` files,
//! `store/sqlite/migrations/NNNN_<what>.sql` and
//! `store/postgres/migrations/NNNN_<what>.sql`, compiled into the binary.
//! File `N` takes a database from schema version `N - 1` to `N`; each
//! backend lists its files in order (`migrations!`) beside the version it
//! writes, `SCHEMA_VERSION`, which is the number of the last file. Every
//! step is SQL alone (no step rewrites data in Rust). A shipped file is
//! never edited; a schema change is a file more.

/// One schema step: its file's name (without `.sql`) and its SQL.
#[derive(Debug, Clone, Copy)]
pub(super) struct Migration {
    pub(super) file: &'static str,
    pub(super) sql: &'static str,
}

/// The migrations of the backend in `store/$dir/migrations/`, one
/// [`Migration`] per file name given, in the order given.
macro_rules! migrations {
    ($dir:literal: $($file:literal),+ $(,)?) => {
        &[$($crate::store::migrations::Migration {
            file: $file,
            sql: include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/src/store/",
                $dir,
                "/migrations/",
                $file,
                ".sql"
            )),
        }),+]
    };
}
pub(super) use migrations;

/// What is wrong with a backend's migrations: `files` (the `.sql` files in
/// its directory, without `.sql`), `listed` (its list, in order) and
/// `version` (the schema version it writes) must be the files
/// `0001_…` to `N_…`, numbered without a gap, all listed in that order,
/// with `N == version`.
#[cfg(test)]
fn problems(files: &[String], listed: &[&str], version: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut sorted = files.to_vec();
    sorted.sort();
    for (i, f) in sorted.iter().enumerate() {
        let number = f.split_once('_').and_then(|(n, _)| {
            (n.len() == 4 && n.bytes().all(|b| b.is_ascii_digit())).then(|| n.parse::<usize>())
        });
        match number {
            Some(Ok(n)) if n == i + 1 => {}
            _ => out.push(format!("`{f}.sql` should be numbered {:04}", i + 1)),
        }
    }
    if sorted != listed {
        out.push(format!("the files {sorted:?} are not the list {listed:?}"));
    }
    if sorted.len() != version {
        out.push(format!(
            "{} files but schema version {version}",
            sorted.len()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{Migration, problems};

    /// The `.sql` files in `store/<backend>/migrations/`, without `.sql`.
    fn files(backend: &str) -> Vec<String> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src/store")
            .join(backend)
            .join("migrations");
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&dir).expect("migrations directory") {
            let name = entry.expect("entry").file_name();
            let name = name.to_str().expect("UTF-8 name");
            let stem = name.strip_suffix(".sql");
            assert!(
                stem.is_some(),
                "{name} in {} is no .sql file",
                dir.display()
            );
            out.extend(stem.map(str::to_owned));
        }
        out
    }

    fn check(backend: &str, list: &[Migration], version: usize) {
        let listed: Vec<&str> = list.iter().map(|m| m.file).collect();
        assert_eq!(
            problems(&files(backend), &listed, version),
            Vec::<String>::new()
        );
    }

    #[test]
    fn the_sqlite_migrations_are_numbered_to_the_schema_version() {
        check(
            "sqlite",
            crate::store::sqlite::MIGRATIONS,
            crate::store::sqlite::SCHEMA_VERSION,
        );
    }

    #[test]
    fn the_postgres_migrations_are_numbered_to_the_schema_version() {
        check(
            "postgres",
            crate::store::postgres::MIGRATIONS,
            crate::store::postgres::SCHEMA_VERSION,
        );
    }

    /// Each way a backend's migrations can go wrong is found.
    #[test]
    fn gaps_strays_and_a_wrong_version_are_found() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let good = ["0001_a", "0002_b", "0003_c"];
        assert!(problems(&names(&good), &good, 3).is_empty());
        let gap = ["0001_a", "0003_c"];
        let found = problems(&names(&gap), &gap, 2);
        assert_eq!(found, ["`0003_c.sql` should be numbered 0002"]);
        let found = problems(&names(&good), &good, 4);
        assert_eq!(found, ["3 files but schema version 4"]);
        let found = problems(&names(&good), &good[..2], 3);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("are not the list"), "{found:?}");
        let unnumbered = ["0001_a", "b"];
        let found = problems(&names(&unnumbered), &unnumbered, 2);
        assert_eq!(found, ["`b.sql` should be numbered 0002"]);
        let twice = ["0001_a", "0001_b"];
        let found = problems(&names(&twice), &twice, 2);
        assert_eq!(found, ["`0001_b.sql` should be numbered 0002"]);
    }
}
