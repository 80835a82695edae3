//! Expectations that differ between kernels, as data: a table of version ranges,
//! the row for the running kernel (`uname -r`) chosen at run time.
//!
//! A test that compares with the kernel's verdict or message names both kernels'
//! answers in one table instead of matching loosely; a kernel no row covers fails
//! the test with the table, so a new kernel's answer gets its own row.

use std::fmt;

/// A kernel version, `major.minor` (the patch level never changed a verdict we test).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32, pub u32);

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.0, self.1)
    }
}

impl Version {
    /// Reads `major.minor` from a release string such as `6.18.44-fc-v1272`.
    pub fn parse(release: &str) -> Option<Version> {
        let mut parts = release.split(|c: char| !c.is_ascii_digit());
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        Some(Version(major, minor))
    }

    /// The running kernel's version, from `uname -r`'s source.
    pub fn running() -> Version {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_else(|e| panic!("cannot read the kernel release: {e}"));
        Version::parse(release.trim())
            .unwrap_or_else(|| panic!("cannot read a version in kernel release `{release}`"))
    }
}

/// One row: from `from` (included) up to `until` (excluded; `None`: no end), the
/// kernel answers `value`.
pub struct Row<T> {
    pub from: Version,
    pub until: Option<Version>,
    pub value: T,
}

/// The value of the row that covers `v`; panics, listing the table, if none does.
pub fn pick<T: fmt::Debug>(table: &[Row<T>], v: Version) -> &T {
    table
        .iter()
        .find(|r| r.from <= v && r.until.is_none_or(|u| v < u))
        .map(|r| &r.value)
        .unwrap_or_else(|| {
            let rows: Vec<String> = table
                .iter()
                .map(|r| {
                    let until = r.until.map(|u| u.to_string()).unwrap_or_default();
                    format!("  {}..{until}: {:?}", r.from, r.value)
                })
                .collect();
            panic!(
                "no expectation for kernel {v}; the table has:\n{}\nadd a row for this \
                 kernel from what it answers",
                rows.join("\n")
            )
        })
}

/// [`pick`] for the running kernel.
pub fn for_running<T: fmt::Debug>(table: &[Row<T>]) -> &T {
    pick(table, Version::running())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_from_distribution_release_strings() {
        assert_eq!(Version::parse("6.18.44-fc-v1272"), Some(Version(6, 18)));
        assert_eq!(Version::parse("6.1.0-28-amd64"), Some(Version(6, 1)));
        assert_eq!(Version::parse("5.15.0"), Some(Version(5, 15)));
        assert_eq!(Version::parse("garbage"), None);
    }

    #[test]
    fn the_row_covering_a_version_is_picked_and_ends_are_excluded() {
        let table = [
            Row {
                from: Version(6, 1),
                until: Some(Version(6, 18)),
                value: "old",
            },
            Row {
                from: Version(6, 18),
                until: None,
                value: "new",
            },
        ];
        assert_eq!(*pick(&table, Version(6, 1)), "old");
        assert_eq!(*pick(&table, Version(6, 17)), "old");
        assert_eq!(*pick(&table, Version(6, 18)), "new");
        assert_eq!(*pick(&table, Version(7, 0)), "new");
        let missing = std::panic::catch_unwind(|| *pick(&table, Version(5, 15)));
        assert!(missing.is_err(), "5.15 has no row and must fail");
    }
}
