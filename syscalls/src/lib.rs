//! The system call tracepoints bpftime serves in userspace: the `syscalls` group
//! (`sys_enter_NAME`, `sys_exit_NAME`, one pair per system call) and the
//! `raw_syscalls` group (`sys_enter`, `sys_exit`), with the ids and the tracefs
//! `format` files loaders read to attach to them, and the record layout programs see.
//!
//! The table of system calls is data (`data/x86_64.tsv`, written from a kernel's own
//! format files by `scripts/gen-syscall-table.sh`), read once.

mod table;
mod tracefs;

pub use table::{by_name, by_nr, table, Arg, Syscall};
pub use tracefs::{served_file, served_path_exists, Ids, TRACEFS_ROOTS};

/// Where the `common_*` fields end and a syscall record's own fields begin.
pub const COMMON_SIZE: u32 = 8;
/// Offset of `__syscall_nr` (an `int`) in a `syscalls` record, and of `id` (a `long`)
/// in a `raw_syscalls` one.
pub const NR_OFFSET: u32 = 8;
/// Offset of the first argument of a `sys_enter_*` record, and of `ret` in an exit
/// record: each argument takes 8 bytes whatever its C type.
pub const ARGS_OFFSET: u32 = 16;
/// Arguments a system call takes at most on x86-64.
pub const MAX_ARGS: usize = 6;

/// One syscall tracepoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Event {
    /// `syscalls:sys_enter_NAME` of the system call with this number.
    Enter(u32),
    /// `syscalls:sys_exit_NAME`.
    Exit(u32),
    /// `raw_syscalls:sys_enter`: every system call, on entry.
    RawEnter,
    /// `raw_syscalls:sys_exit`: every system call, on return.
    RawExit,
}

impl Event {
    /// The event that `group` and `name` (as in `events/GROUP/NAME` of tracefs, or
    /// `SEC("tracepoint/GROUP/NAME")`) name, if bpftime serves it.
    pub fn parse(group: &str, name: &str) -> Option<Event> {
        match group {
            "raw_syscalls" => match name {
                "sys_enter" => Some(Event::RawEnter),
                "sys_exit" => Some(Event::RawExit),
                _ => None,
            },
            "syscalls" => {
                if let Some(call) = name.strip_prefix("sys_enter_") {
                    by_name(call).map(|s| Event::Enter(s.nr))
                } else {
                    let call = name.strip_prefix("sys_exit_")?;
                    by_name(call).map(|s| Event::Exit(s.nr))
                }
            }
            _ => None,
        }
    }

    /// The event a program's ELF section attaches it to, as libbpf reads the section:
    /// `tracepoint/GROUP/NAME` or `tp/GROUP/NAME` for a tracepoint, and
    /// `raw_tracepoint/NAME` or `raw_tp/NAME` for the raw `sys_enter` and `sys_exit`
    /// (which watch the same calls as `raw_syscalls`'); None for any other section.
    pub fn from_section(section: &str) -> Option<Event> {
        if let Some(raw) = ["raw_tracepoint/", "raw_tp/"]
            .iter()
            .find_map(|p| section.strip_prefix(p))
        {
            return Event::parse("raw_syscalls", raw);
        }
        let rest = ["tracepoint/", "tp/"]
            .iter()
            .find_map(|p| section.strip_prefix(p))?;
        let (group, name) = rest.split_once('/')?;
        Event::parse(group, name)
    }

    /// `GROUP/NAME`, as tracefs's directories and libbpf's section names write it.
    pub fn path(&self) -> String {
        format!("{}/{}", self.group(), self.name())
    }

    pub fn group(&self) -> &'static str {
        match self {
            Event::Enter(_) | Event::Exit(_) => "syscalls",
            Event::RawEnter | Event::RawExit => "raw_syscalls",
        }
    }

    pub fn name(&self) -> String {
        match self {
            Event::Enter(nr) => format!("sys_enter_{}", call_name(*nr)),
            Event::Exit(nr) => format!("sys_exit_{}", call_name(*nr)),
            Event::RawEnter => "sys_enter".into(),
            Event::RawExit => "sys_exit".into(),
        }
    }

    /// Whether it fires before the system call runs (else after it returned).
    pub fn is_enter(&self) -> bool {
        matches!(self, Event::Enter(_) | Event::RawEnter)
    }

    /// The record's size, up to which a program may read its context (the kernel's
    /// `trace_event_get_offsets`, which it checks a program's reads against at attach).
    pub fn record_size(&self) -> u32 {
        match self {
            Event::Enter(nr) => ARGS_OFFSET + 8 * by_nr(*nr).map_or(0, |s| s.args.len() as u32),
            Event::RawEnter => ARGS_OFFSET + 8 * MAX_ARGS as u32,
            Event::Exit(_) | Event::RawExit => ARGS_OFFSET + 8,
        }
    }

    /// Every event bpftime serves, raw ones first, then each call's entry and exit by
    /// number.
    pub fn all() -> impl Iterator<Item = Event> {
        [Event::RawEnter, Event::RawExit].into_iter().chain(
            table()
                .iter()
                .flat_map(|s| [Event::Enter(s.nr), Event::Exit(s.nr)]),
        )
    }

    /// The text of the event's tracefs `format` file, given its `id`, as the kernel
    /// writes it.
    pub fn format(&self, id: u32) -> String {
        tracefs::format(self, id)
    }
}

fn call_name(nr: u32) -> &'static str {
    by_nr(nr).map_or("unknown", |s| s.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_name_the_events_libbpf_attaches_them_to() {
        let openat = by_name("openat").unwrap().nr;
        for (section, want) in [
            (
                "tracepoint/syscalls/sys_enter_openat",
                Some(Event::Enter(openat)),
            ),
            ("tp/syscalls/sys_exit_openat", Some(Event::Exit(openat))),
            ("tracepoint/raw_syscalls/sys_enter", Some(Event::RawEnter)),
            ("raw_tracepoint/sys_exit", Some(Event::RawExit)),
            ("raw_tp/sys_enter", Some(Event::RawEnter)),
            ("tracepoint/syscalls/sys_enter_nosuchcall", None),
            ("tracepoint/sched/sched_switch", None),
            ("raw_tp/sched_switch", None),
            ("tp_btf/sys_enter", None),
            ("uprobe/syscalls/sys_enter_openat", None),
            ("tracepoint/syscalls", None),
        ] {
            assert_eq!(Event::from_section(section), want, "{section}");
        }
    }
}
