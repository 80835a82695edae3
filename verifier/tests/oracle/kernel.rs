//! The kernel's verifier through raw `bpf()` calls: maps made with
//! `BPF_MAP_CREATE`, programs offered with `BPF_PROG_LOAD`.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use bpftime_isa::opcode as op;
use bpftime_isa::uapi::cmd;
use bpftime_isa::{encode, Insn};

use super::kernel_object::{assert_kernel_object, BpfObject};
use super::Entry;

/// `BPF_LOG_STATS`: the log ends with "verification time N usec".
pub const LOG_STATS: u32 = 4;

fn bpf(command: u32, attr: &mut [u8]) -> Result<i32, i32> {
    // SAFETY: `attr` is a live, writable buffer of the length passed; every
    // pointer the command reads from it points to a live buffer (callers keep
    // them alive across the call).
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command as libc::c_long,
            attr.as_mut_ptr(),
            attr.len(),
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(r as i32)
    }
}

fn put(a: &mut [u8], at: usize, v: &[u8]) {
    a[at..at + v.len()].copy_from_slice(v);
}

/// Why the kernel cannot serve as the oracle here, if it cannot.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not running as root: the kernel's verifier is the oracle".into());
    }
    let trivial = [Insn::new(0xb7, 0, 0, 0, 0), Insn::new(0x95, 0, 0, 0, 0)];
    match load(bpftime_isa::uapi::prog_type::KPROBE, &trivial, 0, 0) {
        Ok(_) => None,
        Err(r) if r.errno == libc::EPERM || r.errno == libc::ENOSYS => Some(format!(
            "bpf(BPF_PROG_LOAD) fails with {}: no kernel eBPF here",
            std::io::Error::from_raw_os_error(r.errno)
        )),
        Err(r) => Some(format!(
            "a trivial program is refused (errno {}): {}",
            r.errno, r.log
        )),
    }
}

pub struct Loaded {
    pub fd: OwnedFd,
    pub log: String,
    pub elapsed: Duration,
}

#[derive(Debug)]
pub struct Refused {
    pub errno: i32,
    pub log: String,
}

impl Refused {
    /// The reason: the log's last line before the statistics.
    pub fn last_line(&self) -> &str {
        self.log
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty() && !l.starts_with("processed "))
            .unwrap_or("")
    }
}

/// `BPF_PROG_LOAD` with a log of `log_size` bytes at `log_level` (0: none).
pub fn load(
    prog_type: u32,
    insns: &[Insn],
    log_level: u32,
    log_size: usize,
) -> Result<Loaded, Refused> {
    load_with(prog_type, insns, &[], log_level, log_size)
}

/// [`load`] with `fd_array` (what `BPF_PSEUDO_MAP_IDX` indexes).
pub fn load_with(
    prog_type: u32,
    insns: &[Insn],
    fd_array: &[i32],
    log_level: u32,
    log_size: usize,
) -> Result<Loaded, Refused> {
    let code = encode(insns);
    // The kernel takes a callback's address (`lddw rX, func`) only with BTF
    // function info naming every subprogram static; clang would emit it, so a
    // minimal one stands in for programs that take one.
    let takes_func = insns
        .iter()
        .any(|i| i.is_lddw() && i.src == op::PSEUDO_FUNC);
    let func_info = if takes_func {
        Some(func_btf(insns).map_err(|errno| Refused {
            errno,
            log: "BPF_BTF_LOAD of the function info failed".into(),
        })?)
    } else {
        None
    };
    let license = b"GPL\0";
    let mut log = vec![0u8; log_size];
    let mut a = [0u8; 144];
    put(&mut a, 0, &prog_type.to_ne_bytes());
    put(&mut a, 4, &(insns.len() as u32).to_ne_bytes());
    put(&mut a, 8, &(code.as_ptr() as u64).to_ne_bytes());
    put(&mut a, 16, &(license.as_ptr() as u64).to_ne_bytes());
    if log_size > 0 {
        put(&mut a, 24, &log_level.to_ne_bytes());
        put(&mut a, 28, &(log.len() as u32).to_ne_bytes());
        put(&mut a, 32, &(log.as_mut_ptr() as u64).to_ne_bytes());
    }
    put(&mut a, 48, b"corpus\0");
    if !fd_array.is_empty() {
        put(&mut a, 120, &(fd_array.as_ptr() as u64).to_ne_bytes());
    }
    if let Some((btf, info)) = &func_info {
        put(&mut a, 72, &(btf.as_raw_fd() as u32).to_ne_bytes());
        put(&mut a, 76, &8u32.to_ne_bytes());
        put(&mut a, 80, &(info.as_ptr() as u64).to_ne_bytes());
        put(&mut a, 88, &((info.len() / 2) as u32).to_ne_bytes());
    }
    let t = Instant::now();
    let r = bpf(cmd::PROG_LOAD, &mut a);
    let elapsed = t.elapsed();
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    let text = String::from_utf8_lossy(&log[..end]).into_owned();
    match r {
        Ok(fd) => Ok(Loaded {
            fd: {
                assert_kernel_object(fd, BpfObject::Prog, "BPF_PROG_LOAD");
                // SAFETY: the kernel just gave us this fd; nobody else owns it.
                unsafe { OwnedFd::from_raw_fd(fd) }
            },
            log: text,
            elapsed,
        }),
        Err(errno) => Err(Refused { errno, log: text }),
    }
}

/// Where each subprogram starts: 0 and every target of a bpf-to-bpf call or of
/// a function address.
pub fn subprog_starts(insns: &[Insn]) -> Vec<usize> {
    let mut starts = vec![0usize];
    for (pc, i) in insns.iter().enumerate() {
        let call = i.code == op::CALL_INSN && i.src == op::CALL_PSEUDO;
        let func = i.is_lddw() && i.src == op::PSEUDO_FUNC;
        if call || func {
            let t = pc as i64 + i.imm as i64 + 1;
            if (0..insns.len() as i64).contains(&t) {
                starts.push(t as usize);
            }
        }
    }
    starts.sort_unstable();
    starts.dedup();
    starts
}

/// BTF with one static `int fN(void)` per subprogram, loaded; and the
/// `bpf_func_info` records (insn_off, type_id) pairing them up.
fn func_btf(insns: &[Insn]) -> Result<(OwnedFd, Vec<u32>), i32> {
    const KIND_INT: u32 = 1;
    const KIND_FUNC: u32 = 12;
    const KIND_FUNC_PROTO: u32 = 13;
    let starts = subprog_starts(insns);
    let mut strings = b"\0int\0".to_vec();
    let mut types: Vec<u32> = vec![
        // [1] int: 4 bytes, signed, 32 bits.
        1,
        KIND_INT << 24,
        4,
        (1 << 24) | 32,
        // [2] int (void)
        0,
        KIND_FUNC_PROTO << 24,
        1,
    ];
    let mut info = Vec::new();
    for (n, &start) in starts.iter().enumerate() {
        let name = strings.len() as u32;
        strings.extend_from_slice(format!("f{n}\0").as_bytes());
        // [3 + n] static func fN of type [2]
        types.extend_from_slice(&[name, KIND_FUNC << 24, 2]);
        info.extend_from_slice(&[start as u32, 3 + n as u32]);
    }
    let type_bytes: Vec<u8> = types.iter().flat_map(|w| w.to_le_bytes()).collect();
    let mut blob = Vec::new();
    blob.extend_from_slice(&0xeb9fu16.to_le_bytes());
    blob.push(1); // version
    blob.push(0); // flags
    for w in [
        24u32,
        0,
        type_bytes.len() as u32,
        type_bytes.len() as u32,
        strings.len() as u32,
    ] {
        blob.extend_from_slice(&w.to_le_bytes());
    }
    blob.extend_from_slice(&type_bytes);
    blob.extend_from_slice(&strings);
    let mut a = [0u8; 32];
    put(&mut a, 0, &(blob.as_ptr() as u64).to_ne_bytes());
    put(&mut a, 16, &(blob.len() as u32).to_ne_bytes());
    let fd = bpf(cmd::BTF_LOAD, &mut a)?;
    assert_kernel_object(fd, BpfObject::Btf, "BPF_BTF_LOAD");
    // SAFETY: a fresh fd from the kernel, owned here only.
    Ok((unsafe { OwnedFd::from_raw_fd(fd) }, info))
}

/// The entry's maps, created in the kernel; closed on drop.
pub struct Maps(Vec<OwnedFd>);

pub fn create_maps(e: &Entry) -> Result<Maps, String> {
    let mut fds = Vec::new();
    for m in &e.maps {
        let d = &m.desc;
        let mut a = [0u8; 72];
        put(&mut a, 0, &d.map_type.to_ne_bytes());
        put(&mut a, 4, &d.key_size.to_ne_bytes());
        put(&mut a, 8, &d.value_size.to_ne_bytes());
        put(&mut a, 12, &d.max_entries.to_ne_bytes());
        put(&mut a, 16, &d.flags.to_ne_bytes());
        let fd = match bpf(cmd::MAP_CREATE, &mut a) {
            Ok(fd) => {
                assert_kernel_object(fd, BpfObject::Map, "BPF_MAP_CREATE");
                // SAFETY: a fresh fd from the kernel, owned here only.
                unsafe { OwnedFd::from_raw_fd(fd) }
            }
            Err(errno) => {
                return Err(format!(
                    "{}: BPF_MAP_CREATE of `{}` ({d:?}) failed: {}",
                    e.name,
                    m.name,
                    std::io::Error::from_raw_os_error(errno)
                ))
            }
        };
        // The bytes ours is told the map holds, the kernel's map holds too, frozen
        // when ours is told it is.
        let fill = match &d.frozen_value {
            Some(v) => update_elem(fd.as_raw_fd(), &0u32.to_ne_bytes(), v),
            None => Ok(()),
        };
        let freeze = || match d.frozen {
            true => map_freeze(fd.as_raw_fd()),
            false => Ok(()),
        };
        if let Err(errno) = fill.and_then(|_| freeze()) {
            return Err(format!(
                "{}: filling or freezing `{}` failed: {}",
                e.name,
                m.name,
                std::io::Error::from_raw_os_error(errno)
            ));
        }
        fds.push(fd);
    }
    Ok(Maps(fds))
}

/// `BPF_MAP_UPDATE_ELEM` of `value` at `key`, with no flags.
pub fn update_elem(fd: i32, key: &[u8], value: &[u8]) -> Result<(), i32> {
    let mut a = [0u8; 32];
    put(&mut a, 0, &(fd as u32).to_ne_bytes());
    put(&mut a, 8, &(key.as_ptr() as u64).to_ne_bytes());
    put(&mut a, 16, &(value.as_ptr() as u64).to_ne_bytes());
    bpf(cmd::MAP_UPDATE_ELEM, &mut a).map(|_| ())
}

/// `BPF_MAP_FREEZE`: system calls may no longer write the map.
pub fn map_freeze(fd: i32) -> Result<(), i32> {
    let mut a = [0u8; 8];
    put(&mut a, 0, &(fd as u32).to_ne_bytes());
    bpf(cmd::MAP_FREEZE, &mut a).map(|_| ())
}

impl Maps {
    /// The entry's instructions with map indices replaced by the kernel's fds
    /// (an index with no map becomes -1, which the kernel refuses as we do).
    pub fn patch(&self, insns: &[Insn]) -> Vec<Insn> {
        let mut v = insns.to_vec();
        let mut pc = 0;
        while pc < v.len() {
            let i = &mut v[pc];
            if i.is_lddw() {
                if matches!(i.src, op::PSEUDO_MAP_FD | op::PSEUDO_MAP_VALUE) {
                    i.imm = usize::try_from(i.imm)
                        .ok()
                        .and_then(|k| self.0.get(k))
                        .map_or(-1, |fd| fd.as_raw_fd());
                }
                pc += 2;
            } else {
                pc += 1;
            }
        }
        v
    }
}

impl Maps {
    pub fn fds(&self) -> Vec<i32> {
        self.0.iter().map(|f| f.as_raw_fd()).collect()
    }

    /// Loads `e` with these maps: first without a log (the verdict), then, when
    /// refused, again with a verbose log whose tail holds the reason.
    pub fn load(&self, e: &Entry) -> Result<Loaded, Refused> {
        let insns = self.patch(&e.insns);
        let fds = self.fds();
        match load_with(e.prog_type, &insns, &fds, 0, 0) {
            Ok(l) => Ok(l),
            Err(r) => {
                let again = load_with(e.prog_type, &insns, &fds, 1, 1 << 20);
                Err(Refused {
                    errno: r.errno,
                    log: again.err().map(|x| x.log).unwrap_or_default(),
                })
            }
        }
    }
}

/// The kernel's "verification time N usec" from a `LOG_STATS` log.
pub fn verification_usec(log: &str) -> Option<u64> {
    log.lines().find_map(|l| {
        l.strip_prefix("verification time ")?
            .strip_suffix(" usec")?
            .trim()
            .parse()
            .ok()
    })
}
