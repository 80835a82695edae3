//! The system call table, parsed once from the data file.

use std::sync::OnceLock;

/// One system call that has tracepoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Syscall {
    /// The tracepoints' name for it (`openat`; `newstat` for `stat`, as the kernel
    /// names events after its `SYSCALL_DEFINE`s).
    pub name: &'static str,
    pub nr: u32,
    pub args: Vec<Arg>,
}

/// An argument, as the format file declares its field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arg {
    /// The C type (`const char *`).
    pub ty: &'static str,
    pub name: &'static str,
}

const DATA: &str = include_str!("../data/x86_64.tsv");

/// Every system call with tracepoints, by number.
pub fn table() -> &'static [Syscall] {
    static TABLE: OnceLock<Vec<Syscall>> = OnceLock::new();
    TABLE.get_or_init(|| parse(DATA))
}

/// Lines that do not read are left out: the file is ours and its test reads every one.
fn parse(data: &'static str) -> Vec<Syscall> {
    let mut out: Vec<Syscall> = data
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|line| {
            let mut fields = line.split('\t');
            let name = fields.next()?;
            let nr = fields.next()?.parse().ok()?;
            let args = fields
                .map(|a| {
                    let (ty, name) = a.rsplit_once(' ')?;
                    Some(Arg { ty, name })
                })
                .collect::<Option<Vec<_>>>()?;
            Some(Syscall { name, nr, args })
        })
        .collect();
    out.sort_by_key(|s| s.nr);
    out
}

pub fn by_name(name: &str) -> Option<&'static Syscall> {
    table().iter().find(|s| s.name == name)
}

pub fn by_nr(nr: u32) -> Option<&'static Syscall> {
    let t = table();
    t.binary_search_by_key(&nr, |s| s.nr).ok().map(|i| &t[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_of_the_data_file_reads() {
        let lines = DATA.lines().filter(|l| !l.starts_with('#')).count();
        assert_eq!(table().len(), lines);
        assert!(table().len() > 300, "{}", table().len());
        for s in table() {
            assert!(s.args.len() <= crate::MAX_ARGS, "{s:?}");
        }
        let mut nrs: Vec<u32> = table().iter().map(|s| s.nr).collect();
        nrs.dedup();
        assert_eq!(nrs.len(), table().len(), "a number twice");
    }

    #[test]
    fn known_calls_have_their_numbers_and_arguments() {
        let openat = by_name("openat").unwrap();
        assert_eq!(openat.nr, 257);
        let args: Vec<(&str, &str)> = openat.args.iter().map(|a| (a.ty, a.name)).collect();
        assert_eq!(
            args,
            [
                ("int", "dfd"),
                ("const char *", "filename"),
                ("int", "flags"),
                ("umode_t", "mode")
            ]
        );
        assert_eq!(by_nr(4).unwrap().name, "newstat");
        assert_eq!(by_nr(39).unwrap().name, "getpid");
        assert!(by_nr(39).unwrap().args.is_empty());
        assert_eq!(by_nr(100_000), None);
    }
}
