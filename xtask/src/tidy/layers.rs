//! Rule: every import points down. A crate whose code-map section in
//! ARCHITECTURE.md holds a list of floors (a line starting
//! `Floors, bottom first`, then one numbered line per floor naming its
//! modules in backticks, `crate` for the crate root) has each of its
//! modules on the floor of its longest listed prefix, and a module names
//! (in non-test code, with the paths `graph` reads, to the crate root
//! too) only modules on floors below its own, or its own room. Two rooms
//! on one floor know nothing of each other. A module no listed prefix
//! covers fails, naming itself, so a new top-level module takes a floor.
//! `crates/central-authority` must hold such a list.

use std::collections::BTreeMap;
use std::path::Path;

use super::graph::module_edges;
use super::{
    ModulePath, Source, Violation, locate, members, module_name, non_test_sources, planted, read,
    report,
};

/// The crate that must list its floors.
const LAYERED: &str = "crates/central-authority";

/// The line that opens a section's list of floors.
const FLOORS: &str = "Floors, bottom first";

/// A crate's floors as ARCHITECTURE.md lists them: each room (a module
/// path, `[]` for the crate root) with its floor, from 1 at the bottom.
#[derive(Debug, Default)]
struct Floors {
    rooms: BTreeMap<ModulePath, usize>,
}

impl Floors {
    /// The room a module belongs to: its longest listed prefix (the crate
    /// root is the room of no module but itself).
    fn room_of<'a>(&'a self, m: &ModulePath) -> Option<(&'a ModulePath, usize)> {
        self.rooms
            .iter()
            .filter(|(room, _)| m.starts_with(room) && (!room.is_empty() || m.is_empty()))
            .max_by_key(|(room, _)| room.len())
            .map(|(room, floor)| (room, *floor))
    }
}

/// The floors listed in each crate section of ARCHITECTURE.md (`path`,
/// `text`), by the section's crate directory; a malformed list is a
/// violation.
fn listed_floors(path: &Path, text: &str) -> (BTreeMap<String, Floors>, Vec<Violation>) {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = BTreeMap::new();
    let mut problems = Vec::new();
    let mut section: Option<String> = None;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        if let Some(heading) = line.strip_prefix("### `") {
            section = heading.strip_suffix('`').map(str::to_owned);
        } else if line.starts_with("## ") {
            section = None;
        }
        if !line.starts_with(FLOORS) {
            i += 1;
            continue;
        }
        let Some(dir) = section.clone() else {
            problems.push(Violation {
                file: path.to_path_buf(),
                line: i + 1,
                what: format!("`{FLOORS}` outside a crate's code-map section"),
            });
            i += 1;
            continue;
        };
        let mut floors = Floors::default();
        i += 1;
        while lines.get(i).is_some_and(|l| l.trim().is_empty()) {
            i += 1;
        }
        while let Some(item) = lines.get(i).map(|l| l.trim()) {
            let Some((number, names)) = item.split_once(". ") else {
                break;
            };
            let Ok(number) = number.parse::<usize>() else {
                break;
            };
            let expected = floors.rooms.values().max().map_or(1, |f| f + 1);
            let rooms: Vec<&str> = names.split('`').skip(1).step_by(2).collect();
            if number != expected || rooms.is_empty() {
                problems.push(Violation {
                    file: path.to_path_buf(),
                    line: i + 1,
                    what: format!(
                        "floor {number} of `{dir}`: expected floor {expected} naming its modules in backticks"
                    ),
                });
            }
            for room in rooms {
                let module: ModulePath = if room == "crate" {
                    Vec::new()
                } else {
                    room.split("::").map(str::to_owned).collect()
                };
                if floors.rooms.insert(module, number).is_some() {
                    problems.push(Violation {
                        file: path.to_path_buf(),
                        line: i + 1,
                        what: format!("`{room}` is listed on two floors of `{dir}`"),
                    });
                }
            }
            i += 1;
        }
        out.insert(dir, floors);
    }
    (out, problems)
}

/// The imports of one crate's `src/` that do not point down its `floors`,
/// one per pair of modules at its first line, and the modules on no floor.
fn upward_imports(src: &Path, sources: &[Source], floors: &Floors) -> Vec<Violation> {
    let mut found: BTreeMap<(ModulePath, Option<ModulePath>), Violation> = BTreeMap::new();
    let mut modules = Vec::new();
    for s in sources {
        let Ok(rel) = s.path.strip_prefix(src) else {
            continue;
        };
        let (root, module) = locate(rel);
        if !root.is_empty() {
            continue;
        }
        modules.push(module.clone());
        if floors.room_of(&module).is_none() {
            let what = format!("module `{}` is on no floor", module_name(&module));
            let file = s.path.clone();
            found.insert(
                (module, None),
                Violation {
                    file,
                    line: 0,
                    what,
                },
            );
        }
    }
    for (room, floor) in &floors.rooms {
        if !modules.iter().any(|m| m.starts_with(room)) {
            let what = format!(
                "floor {floor} lists `{}`, which is no module of this crate",
                module_name(room)
            );
            let file = src.to_path_buf();
            found.insert(
                (room.clone(), None),
                Violation {
                    file,
                    line: 0,
                    what,
                },
            );
        }
    }
    for e in module_edges(src, sources).remove("").unwrap_or_default() {
        let (Some((from_room, from_floor)), Some((to_room, to_floor))) =
            (floors.room_of(&e.from), floors.room_of(&e.to))
        else {
            continue;
        };
        let sideways = to_floor == from_floor && to_room != from_room;
        if to_floor > from_floor || sideways {
            let way = if sideways {
                format!("on its own floor {to_floor}")
            } else {
                format!("on floor {to_floor}, above its floor {from_floor}")
            };
            let what = format!(
                "`{}` imports `{}`, {way}",
                module_name(&e.from),
                module_name(&e.to)
            );
            found.entry((e.from, Some(e.to))).or_insert(Violation {
                file: e.file,
                line: e.line,
                what,
            });
        }
    }
    found.into_values().collect()
}

#[test]
fn every_import_points_down_the_listed_floors() {
    let path = Path::new("ARCHITECTURE.md");
    let (listed, mut violations) = listed_floors(path, &read(path));
    if !listed.contains_key(LAYERED) {
        violations.push(Violation {
            file: path.to_path_buf(),
            line: 0,
            what: format!("the `{LAYERED}` section lists no floors (`{FLOORS}`)"),
        });
    }
    for member in members() {
        let dir = member.dir.to_string_lossy().replace('\\', "/");
        if let Some(floors) = listed.get(&dir) {
            let src = member.dir.join("src");
            violations.extend(upward_imports(&src, &non_test_sources(&src), floors));
        }
    }
    report(
        "every import points down the floors ARCHITECTURE.md lists",
        &violations,
    );
}

/// A code map with floors for `crates/a`: `base` under `store` and
/// `logs`, then `state`, then `crate`.
const PLANTED_MAP: &str = "# A\n## Code map\n### `crates/a`\nText.\n\nFloors, bottom first (read by tidy):\n\n1. `base`\n2. `store`, `logs`\n3. `state`\n4. `crate`\n\nMore text.\n";

#[test]
fn layer_rule_reads_the_floors() {
    let (listed, problems) = listed_floors(Path::new("A.md"), PLANTED_MAP);
    assert!(problems.is_empty());
    let floors = &listed["crates/a"];
    let module = |p: &str| p.split("::").map(str::to_owned).collect::<ModulePath>();
    assert_eq!(
        floors.room_of(&module("store::sqlite")).map(|r| r.1),
        Some(2)
    );
    assert_eq!(floors.room_of(&module("state::top")).map(|r| r.1), Some(3));
    assert_eq!(floors.room_of(&Vec::new()).map(|r| r.1), Some(4));
    assert_eq!(floors.room_of(&module("tools")), None);
    let broken = PLANTED_MAP.replace("3. `state`", "4. `state`");
    let (_, problems) = listed_floors(Path::new("A.md"), &broken);
    assert!(
        problems[0].what.contains("expected floor 3"),
        "{}",
        problems[0].what
    );
}

#[test]
fn layer_rule_finds_planted_upward_imports() {
    let map = PLANTED_MAP.replace("`logs`", "`logs`, `gone`");
    let (listed, _) = listed_floors(Path::new("A.md"), &map);
    let fake = planted(&[
        (
            "src/lib.rs",
            "pub mod base;\npub mod store;\npub mod logs;\npub mod state;\npub mod tools;\npub use state::S;\npub struct RunError;\n",
        ),
        ("src/base.rs", "//! base\nuse crate::store::Store;\n"),
        (
            "src/store/mod.rs",
            "//! store\nmod sqlite;\nuse crate::base::now;\nfn f() -> crate::RunError {\n    crate::logs::emit();\n}\n",
        ),
        (
            "src/store/sqlite.rs",
            "//! sqlite\nuse super::Store;\nuse crate::{base, state::{self, S}};\n",
        ),
        (
            "src/logs.rs",
            "//! logs\n#[cfg(test)]\nmod tests {\n    use crate::state::S;\n}\n",
        ),
        (
            "src/state/mod.rs",
            "//! state\npub mod top;\nuse crate::{base::now, store::Store, logs};\n",
        ),
        ("src/state/top.rs", "//! top\nuse super::super::state;\n"),
        ("src/tools.rs", "//! tools\nuse crate::RunError;\n"),
    ]);
    let found = upward_imports(Path::new("src"), &fake, &listed["crates/a"]);
    let lines: Vec<String> = found.iter().map(Violation::line).collect();
    assert_eq!(
        lines,
        [
            "src/base.rs:2: `base` imports `store`, on floor 2, above its floor 1",
            "src: floor 2 lists `gone`, which is no module of this crate",
            "src/store/mod.rs:4: `store` imports `<root>`, on floor 4, above its floor 2",
            "src/store/mod.rs:5: `store` imports `logs`, on its own floor 2",
            "src/store/sqlite.rs:3: `store::sqlite` imports `state`, on floor 3, above its floor 2",
            "src/tools.rs: module `tools` is on no floor",
        ],
        "{lines:#?}"
    );
}

#[test]
fn layer_rule_passes_a_layered_crate() {
    let (listed, _) = listed_floors(Path::new("A.md"), PLANTED_MAP);
    let fake = planted(&[
        (
            "src/lib.rs",
            "pub mod base;\npub mod store;\npub mod state;\nuse crate::state::S;\nfn run() { crate::store::open(); }\n",
        ),
        (
            "src/base.rs",
            "//! base\npub fn now() {}\n#[cfg(test)]\nmod tests {\n    use crate::state;\n}\n",
        ),
        (
            "src/store/mod.rs",
            "//! store\nmod sqlite;\nuse crate::base::now;\n",
        ),
        (
            "src/store/sqlite.rs",
            "//! sqlite\nuse super::Store;\nuse crate::{base, store};\n",
        ),
        (
            "src/state/mod.rs",
            "//! state\npub mod top;\nuse crate::{base::now, store::Store};\n",
        ),
        (
            "src/state/top.rs",
            "//! top\nuse super::super::state;\nuse crate::store;\n",
        ),
        ("src/logs.rs", "//! logs\nuse crate::base;\n"),
    ]);
    let found = upward_imports(Path::new("src"), &fake, &listed["crates/a"]);
    let lines: Vec<String> = found.iter().map(Violation::line).collect();
    assert!(found.is_empty(), "{lines:#?}");
}
