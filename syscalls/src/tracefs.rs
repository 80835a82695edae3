//! Tracepoint ids and the tracefs files loaders read: `events/GROUP/NAME/id`,
//! `events/GROUP/NAME/format` and `available_events`.

use crate::{by_nr, Event, ARGS_OFFSET, MAX_ARGS};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

/// Where loaders look for tracefs: libbpf and bcc try the debugfs path first.
pub const TRACEFS_ROOTS: [&str; 2] = ["/sys/kernel/debug/tracing", "/sys/kernel/tracing"];

/// The first id of bpftime's own numbering, used where the kernel's cannot be read.
/// Tracepoint ids are `unsigned short` in a record's `common_type`.
const OWN_BASE: u32 = 30000;

/// The id of each served event, and the event of each id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ids {
    by_event: HashMap<Event, u32>,
    by_id: HashMap<u32, Event>,
    /// Whether the ids are the kernel's (read from its tracefs).
    pub kernel: bool,
}

impl Ids {
    fn from_pairs(pairs: impl Iterator<Item = (Event, u32)>, kernel: bool) -> Ids {
        let mut ids = Ids {
            by_event: HashMap::new(),
            by_id: HashMap::new(),
            kernel,
        };
        for (e, id) in pairs {
            ids.by_event.insert(e, id);
            ids.by_id.insert(id, e);
        }
        ids
    }

    /// bpftime's own numbering: stable for a given table, apart from the kernel's
    /// usual range.
    pub fn own() -> Ids {
        Ids::from_pairs(Event::all().zip(OWN_BASE..), false)
    }

    /// The kernel's ids, from the tracefs mounted at `root`; None when they cannot be
    /// read. An event the kernel lacks is not served.
    pub fn from_tracefs(root: &Path) -> Option<Ids> {
        Ids::from_lookup(|e| {
            let p = root.join("events").join(e.path()).join("id");
            std::fs::read_to_string(p).ok()?.trim().parse().ok()
        })
    }

    /// The kernel's ids as `read` gives each event's (None for an event it lacks);
    /// None when even the raw events have none, which means tracefs cannot be read.
    pub fn from_lookup(read: impl Fn(&Event) -> Option<u32>) -> Option<Ids> {
        read(&Event::RawEnter)?;
        Some(Ids::from_pairs(
            Event::all().filter_map(|e| Some((e, read(&e)?))),
            true,
        ))
    }

    /// The kernel's ids where its tracefs can be read, else bpftime's own.
    pub fn detect() -> Ids {
        TRACEFS_ROOTS
            .iter()
            .find_map(|r| Ids::from_tracefs(Path::new(r)))
            .unwrap_or_else(Ids::own)
    }

    pub fn id(&self, e: Event) -> Option<u32> {
        self.by_event.get(&e).copied()
    }

    pub fn event(&self, id: u64) -> Option<Event> {
        u32::try_from(id)
            .ok()
            .and_then(|id| self.by_id.get(&id).copied())
    }
}

/// What a tracefs file of a served event (its `id` or `format`), or
/// `available_events`, reads, numbered by `ids`; None for every other path.
pub fn served_file(path: &[u8], ids: &Ids) -> Option<String> {
    let path = std::str::from_utf8(path).ok()?;
    let rest = TRACEFS_ROOTS
        .iter()
        .find_map(|r| path.strip_prefix(r)?.strip_prefix('/'))?;
    if rest == "available_events" {
        let mut out = String::new();
        for e in Event::all().filter(|e| ids.id(*e).is_some()) {
            let _ = writeln!(out, "{}:{}", e.group(), e.name());
        }
        return Some(out);
    }
    let mut parts = rest.strip_prefix("events/")?.split('/');
    let (group, name, file) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let event = Event::parse(group, name)?;
    let id = ids.id(event)?;
    match file {
        "id" => Some(format!("{id}\n")),
        "format" => Some(event.format(id)),
        _ => None,
    }
}

/// Whether `path` is a tracefs directory or file of a served event (`events/GROUP`,
/// `events/GROUP/NAME`, its `id` and `format`) or `available_events`, numbered by `ids`:
/// what tools ask `access()` before they attach (libbpf-tools' `tracepoint_exists`).
pub fn served_path_exists(path: &[u8], ids: &Ids) -> bool {
    let Some(rest) = std::str::from_utf8(path).ok().and_then(|p| {
        TRACEFS_ROOTS
            .iter()
            .find_map(|r| p.strip_prefix(r)?.strip_prefix('/'))
    }) else {
        return false;
    };
    let rest = rest.trim_end_matches('/');
    if rest == "available_events" {
        return true;
    }
    let Some(events) = rest.strip_prefix("events/") else {
        return false;
    };
    let parts: Vec<&str> = events.split('/').collect();
    match parts[..] {
        [group] => matches!(group, "syscalls" | "raw_syscalls"),
        [group, name] => Event::parse(group, name).is_some_and(|e| ids.id(e).is_some()),
        [group, name, "id" | "format"] => {
            Event::parse(group, name).is_some_and(|e| ids.id(e).is_some())
        }
        _ => false,
    }
}

fn field(out: &mut String, decl: &str, offset: u32, size: u32, signed: bool) {
    let _ = writeln!(
        out,
        "\tfield:{decl};\toffset:{offset};\tsize:{size};\tsigned:{};",
        signed as u8
    );
}

pub(crate) fn format(e: &Event, id: u32) -> String {
    let mut out = format!("name: {}\nID: {id}\nformat:\n", e.name());
    field(&mut out, "unsigned short common_type", 0, 2, false);
    field(&mut out, "unsigned char common_flags", 2, 1, false);
    field(&mut out, "unsigned char common_preempt_count", 3, 1, false);
    field(&mut out, "int common_pid", 4, 4, true);
    out.push('\n');
    let print = match e {
        Event::Enter(nr) => {
            field(&mut out, "int __syscall_nr", 8, 4, true);
            let args = by_nr(*nr).map_or(&[][..], |s| &s.args[..]);
            for (i, a) in args.iter().enumerate() {
                let decl = format!("{} {}", a.ty, a.name);
                field(&mut out, &decl, ARGS_OFFSET + 8 * i as u32, 8, false);
            }
            let shown: Vec<String> = args
                .iter()
                .map(|a| format!("{}: 0x%08lx", a.name))
                .collect();
            let values: String = args
                .iter()
                .map(|a| format!(", ((unsigned long)(REC->{}))", a.name))
                .collect();
            format!("\"{}\"{values}", shown.join(", "))
        }
        Event::Exit(_) => {
            field(&mut out, "int __syscall_nr", 8, 4, true);
            field(&mut out, "long ret", ARGS_OFFSET, 8, true);
            "\"0x%lx\", REC->ret".into()
        }
        Event::RawEnter => {
            field(&mut out, "long id", 8, 8, true);
            field(
                &mut out,
                &format!("unsigned long args[{MAX_ARGS}]"),
                ARGS_OFFSET,
                8 * MAX_ARGS as u32,
                false,
            );
            let args: String = (0..MAX_ARGS).map(|i| format!(", REC->args[{i}]")).collect();
            format!("\"NR %ld (%lx, %lx, %lx, %lx, %lx, %lx)\", REC->id{args}")
        }
        Event::RawExit => {
            field(&mut out, "long id", 8, 8, true);
            field(&mut out, "long ret", ARGS_OFFSET, 8, true);
            "\"NR %ld = %ld\", REC->id, REC->ret".into()
        }
    };
    let _ = writeln!(out, "\nprint fmt: {print}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table;

    /// Linux 6.18's `events/syscalls/sys_enter_openat/format`, byte for byte.
    const OPENAT: &str = "name: sys_enter_openat\nID: 782\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n\
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n\
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\
\n\
\tfield:int __syscall_nr;\toffset:8;\tsize:4;\tsigned:1;\n\
\tfield:int dfd;\toffset:16;\tsize:8;\tsigned:0;\n\
\tfield:const char * filename;\toffset:24;\tsize:8;\tsigned:0;\n\
\tfield:int flags;\toffset:32;\tsize:8;\tsigned:0;\n\
\tfield:umode_t mode;\toffset:40;\tsize:8;\tsigned:0;\n\
\n\
print fmt: \"dfd: 0x%08lx, filename: 0x%08lx, flags: 0x%08lx, mode: 0x%08lx\", \
((unsigned long)(REC->dfd)), ((unsigned long)(REC->filename)), \
((unsigned long)(REC->flags)), ((unsigned long)(REC->mode))\n";

    #[test]
    fn formats_read_as_the_kernels() {
        let openat = Event::parse("syscalls", "sys_enter_openat").unwrap();
        assert_eq!(openat.format(782), OPENAT);
        let getpid = Event::parse("syscalls", "sys_enter_getpid").unwrap();
        assert!(getpid.format(1).ends_with("signed:1;\n\nprint fmt: \"\"\n"));
        let exit = Event::parse("syscalls", "sys_exit_openat").unwrap();
        assert!(exit.format(781).ends_with(
            "\tfield:long ret;\toffset:16;\tsize:8;\tsigned:1;\n\nprint fmt: \"0x%lx\", REC->ret\n"
        ));
        assert_eq!(openat.record_size(), 48);
        assert_eq!(exit.record_size(), 24);
        assert_eq!(getpid.record_size(), 16);
        assert_eq!(Event::RawEnter.record_size(), 64);
        assert_eq!(Event::RawExit.record_size(), 24);
    }

    #[test]
    fn served_files_follow_the_ids_and_nothing_else_is_served() {
        let ids = Ids::own();
        assert!(table()
            .iter()
            .all(|s| Event::parse("syscalls", &format!("sys_exit_{}", s.name)).is_some()));
        let openat = Event::parse("syscalls", "sys_enter_openat").unwrap();
        let id = ids.id(openat).unwrap();
        assert_eq!(ids.event(id as u64), Some(openat));
        for root in TRACEFS_ROOTS {
            let p = format!("{root}/events/syscalls/sys_enter_openat/id");
            assert_eq!(served_file(p.as_bytes(), &ids), Some(format!("{id}\n")));
            let p = format!("{root}/events/syscalls/sys_enter_openat/format");
            assert_eq!(served_file(p.as_bytes(), &ids), Some(openat.format(id)));
        }
        let events = served_file(b"/sys/kernel/tracing/available_events", &ids).unwrap();
        assert!(events.starts_with("raw_syscalls:sys_enter\nraw_syscalls:sys_exit\n"));
        assert!(events.contains("\nsyscalls:sys_exit_openat\n"));
        for missing in [
            &b"/sys/kernel/tracing/events/syscalls/sys_enter_nosuchcall/id"[..],
            b"/sys/kernel/tracing/events/sched/sched_switch/id",
            b"/sys/kernel/tracing/events/syscalls/sys_enter_openat/enable",
            b"/sys/kernel/tracing/events/syscalls/sys_enter_openat/id/x",
            b"/sys/kernel/tracingX/events/syscalls/sys_enter_openat/id",
            b"/tmp/events/syscalls/sys_enter_openat/id",
        ] {
            assert_eq!(served_file(missing, &ids), None, "{missing:?}");
        }
        for (p, exists) in [
            ("/sys/kernel/tracing/events/syscalls", true),
            ("/sys/kernel/debug/tracing/events/raw_syscalls/", true),
            (
                "/sys/kernel/tracing/events/syscalls/sys_enter_newstat",
                true,
            ),
            (
                "/sys/kernel/tracing/events/syscalls/sys_exit_newstat/format",
                true,
            ),
            (
                "/sys/kernel/tracing/events/syscalls/sys_enter_nosuchcall",
                false,
            ),
            ("/sys/kernel/tracing/events/sched", false),
            (
                "/sys/kernel/tracing/events/syscalls/sys_enter_newstat/enable",
                false,
            ),
            ("/sys/kernel/tracing", false),
            ("/sys/kernel/tracing/events", false),
        ] {
            assert_eq!(served_path_exists(p.as_bytes(), &ids), exists, "{p}");
        }
        // Distinct ids, all within a record's `unsigned short common_type`.
        let all: Vec<u32> = Event::all().filter_map(|e| ids.id(e)).collect();
        assert_eq!(all.len(), 2 + 2 * table().len());
        assert!(all.iter().all(|&i| i < 65536));
        let mut sorted = all.clone();
        sorted.dedup();
        assert_eq!(sorted.len(), all.len());
    }
}
