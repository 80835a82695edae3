//! Golden files: output a test expects, kept in the repository so that a change in it is
//! a reviewed diff. Every golden file in the workspace is rewritten the same way:
//! `BPFTIME_BLESS=1 cargo test` writes what the code produces now, and `git diff` shows
//! what changed.

use std::path::Path;

/// The environment variable that rewrites golden files instead of comparing with them.
pub const BLESS_VAR: &str = "BPFTIME_BLESS";

/// Whether this run rewrites golden files ([`BLESS_VAR`] is set).
pub fn blessing() -> bool {
    std::env::var_os(BLESS_VAR).is_some()
}

/// Compares `actual` with the golden file at `path`, or, when [`blessing`], writes it
/// there (making its directory). Panics, naming the file and the way to rewrite it, when
/// they differ or the file is missing.
pub fn assert_golden(path: &Path, actual: &str) {
    if blessing() {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        }
        std::fs::write(path, actual).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        return;
    }
    let want = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "golden file {}: {e}; run with {BLESS_VAR}=1 to create it",
            path.display()
        )
    });
    if actual != want {
        let line = actual
            .lines()
            .zip(want.lines())
            .position(|(a, w)| a != w)
            .unwrap_or_else(|| actual.lines().count().min(want.lines().count()));
        panic!(
            "{} differs from what the code produces now, first at line {}:\n  golden: {:?}\n  now:    {:?}\nrun with {BLESS_VAR}=1 to rewrite it if the change is intended, then review the diff",
            path.display(),
            line + 1,
            want.lines().nth(line).unwrap_or("<end of file>"),
            actual.lines().nth(line).unwrap_or("<end of file>"),
        );
    }
}
