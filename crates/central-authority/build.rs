//! Stamps `--version` with the git commit and build date (`build_info`).

fn main() {
    build_info::stamp();
}
