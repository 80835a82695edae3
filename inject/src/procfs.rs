//! What /proc says about a process: its state, its tracer, its mappings.

use std::io;
use std::path::Path;

/// The fields of /proc/PID/status (or /proc/PID/task/TID/status) we act on.
#[derive(Debug, Clone, Default)]
pub(crate) struct Status {
    pub name: String,
    /// First letter of `State:` (R, S, D, T, t, Z, X, I...).
    pub state: char,
    pub tgid: i32,
    pub tracer: i32,
    /// Real, effective, saved and filesystem uid.
    pub uids: [u32; 4],
    /// The pid as the process itself sees it (last entry of `NSpid:`).
    pub ns_pid: i32,
    pub sig_blocked: u64,
    pub sig_ignored: u64,
    /// Effective capabilities (`CapEff:`).
    pub cap_eff: u64,
    /// `x86_Thread_features:` lists `shstk` (kernels that support user shadow stacks).
    pub shadow_stack: bool,
}

pub(crate) fn read_status(path: &Path) -> io::Result<Status> {
    Ok(parse_status(&std::fs::read_to_string(path)?))
}

fn parse_status(text: &str) -> Status {
    let mut s = Status::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        let hex = || u64::from_str_radix(value, 16).unwrap_or(0);
        match key {
            "Name" => s.name = value.to_string(),
            "State" => s.state = value.chars().next().unwrap_or('?'),
            "Tgid" => s.tgid = value.parse().unwrap_or(0),
            "TracerPid" => s.tracer = value.parse().unwrap_or(0),
            "Uid" => {
                for (slot, v) in s.uids.iter_mut().zip(value.split_whitespace()) {
                    *slot = v.parse().unwrap_or(u32::MAX);
                }
            }
            "NSpid" => {
                s.ns_pid = value
                    .split_whitespace()
                    .last()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            }
            "SigBlk" => s.sig_blocked = hex(),
            "SigIgn" => s.sig_ignored = hex(),
            "CapEff" => s.cap_eff = hex(),
            "x86_Thread_features" => {
                s.shadow_stack = value.split_whitespace().any(|f| f == "shstk")
            }
            _ => {}
        }
    }
    s
}

/// One line of /proc/PID/maps, as the attach crate parses it for its own process.
pub(crate) use bpftime_attach::ProcMapping as Mapping;

/// The maps of /proc/PID or /proc/PID/task/TID (`dir`).
pub(crate) fn read_maps(dir: &str) -> io::Result<Vec<Mapping>> {
    let text = std::fs::read_to_string(format!("{dir}/maps"))?;
    Ok(bpftime_attach::parse_proc_maps(&text))
}

/// `kernel.yama.ptrace_scope`, when the Yama security module is present.
pub(crate) fn yama_scope() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

pub(crate) const CAP_SYS_PTRACE: u32 = 19;

/// Machine and word size from the ELF header of the process's executable:
/// `None` when it is x86-64, otherwise a description for the error.
pub(crate) fn foreign_architecture(dir: &str) -> io::Result<Option<String>> {
    use std::io::Read;
    let mut header = [0u8; 20];
    std::fs::File::open(format!("{dir}/exe"))?.read_exact(&mut header)?;
    Ok(describe_foreign(&header))
}

fn describe_foreign(header: &[u8; 20]) -> Option<String> {
    if &header[..4] != b"\x7fELF" {
        return Some("an executable that is not ELF".into());
    }
    let class = header[4];
    let machine = if header[5] == 1 {
        u16::from_le_bytes([header[18], header[19]])
    } else {
        u16::from_be_bytes([header[18], header[19]])
    };
    const EM_386: u16 = 3;
    const EM_X86_64: u16 = 62;
    const EM_AARCH64: u16 = 183;
    const EM_RISCV: u16 = 243;
    match (class, machine) {
        (2, EM_X86_64) => None,
        (1, EM_X86_64) => Some("an x32 program".into()),
        (1, EM_386) => Some("a 32-bit x86 program".into()),
        (_, EM_AARCH64) => Some("an arm64 program".into()),
        (_, EM_RISCV) => Some("a RISC-V program".into()),
        (c, m) => Some(format!(
            "a {}-bit program for ELF machine {m}",
            if c == 1 { 32 } else { 64 }
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_read() {
        let s = parse_status(
            "Name:\tcat\nState:\tS (sleeping)\nTgid:\t42\nTracerPid:\t7\n\
             Uid:\t1000\t1001\t1002\t1003\nNSpid:\t42\t3\nSigBlk:\t0000000000000400\n\
             SigIgn:\t0000000000001000\nCapEff:\t0000000000080000\n\
             x86_Thread_features:\tshstk wrss\n",
        );
        assert_eq!(s.name, "cat");
        assert_eq!(s.state, 'S');
        assert_eq!(s.tgid, 42);
        assert_eq!(s.tracer, 7);
        assert_eq!(s.uids, [1000, 1001, 1002, 1003]);
        assert_eq!(s.ns_pid, 3);
        assert_eq!(s.sig_blocked, 1 << 10);
        assert_eq!(s.sig_ignored, 1 << 12);
        assert_eq!(s.cap_eff, 1 << CAP_SYS_PTRACE);
        assert!(s.shadow_stack);
    }

    fn elf_header(class: u8, machine: u16) -> [u8; 20] {
        let mut h = [0u8; 20];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = class;
        h[5] = 1;
        h[18..20].copy_from_slice(&machine.to_le_bytes());
        h
    }

    #[test]
    fn foreign_executables_are_described() {
        assert_eq!(describe_foreign(&elf_header(2, 62)), None);
        assert_eq!(
            describe_foreign(&elf_header(1, 3)).as_deref(),
            Some("a 32-bit x86 program")
        );
        assert_eq!(
            describe_foreign(&elf_header(2, 183)).as_deref(),
            Some("an arm64 program")
        );
        assert_eq!(
            describe_foreign(&[b'#'; 20]).as_deref(),
            Some("an executable that is not ELF")
        );
        // This test's own executable is x86-64.
        assert_eq!(foreign_architecture("/proc/self").unwrap(), None);
    }
}
