//! The fast path: rewriting a site's `syscall` (`0f 05`) into `call *%rax` (`ff d0`).
//!
//! The call goes to the system call's number as an address, in the page at 0, which holds
//! a sled: instructions of 15 bytes (ten `cs` prefixes, then `mov ecx, 0x90909090`) whose
//! every byte starts an instruction that leads to the next group without touching memory
//! or flags (a `0x90` immediate byte decodes as `nop`), ending in a jump to the entry. On
//! our AMD EPYC VM a sled of `nop`s cost about 40 ns to slide through from a small number,
//! this one about 4. Mapping page 0 needs CAP_SYS_RAWIO or `vm.mmap_min_addr` 0; it also
//! makes reads of null pointers read the sled instead of faulting where the CPU has no
//! execute-only pages, and a call through a null function pointer lands in the entry,
//! which stops it unless its return address is a rewritten site's. Programs rely on null
//! reads faulting (a JVM's implicit null checks, Go's nil checks), so the sled is kept
//! only where the kernel made it execute-only (a protection key on the mapping, x86's
//! PKU: `ProtectionKey` in smaps); elsewhere every call stays on the signal unless
//! `BPFTIME_SYSCALL_REWRITE=1` accepts a readable page 0 for the speed.
//!
//! The `call` pushes its return address below the caller's stack pointer, where a leaf
//! function may keep data (the red zone): only sites in functions that address nothing
//! below their stack pointer are rewritten, the function's bounds coming from its
//! `.eh_frame` entry (every function of the C library and of code built with unwind
//! tables has one; a site in code without one stays on the signal).
//!
//! Sites are offered by the SIGSYS handler, which cannot allocate, and rewritten on a
//! thread of ours: `int3` on the first byte, then the second byte, then the first, each a
//! one-byte write through `/proc/self/mem` (see `patch`); a thread that meets the `int3`
//! in between is sent back to retry the site. Every intermediate state is safe to run.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use iced_x86::{Decoder, DecoderOptions, OpKind, Register};

use crate::entry::{self, raw};
use crate::{SITES, SITE_SLOTS};
use bpftime_attach::patch::{read_code, register_trap, write_code};

/// Whether the page at 0 holds the sled, so that sites can be rewritten.
static FAST: AtomicBool = AtomicBool::new(false);
/// Sites offered and not yet taken by the rewriter (0: a free slot).
const QUEUE_SLOTS: usize = 256;
static QUEUE: [AtomicUsize; QUEUE_SLOTS] = [const { AtomicUsize::new(0) }; QUEUE_SLOTS];
/// Bumped at each offer: the futex word the rewriter sleeps on.
static OFFERS: AtomicU32 = AtomicU32::new(0);
/// Sites the rewriter looked at (rewritten or refused), never offered again.
const SEEN_SLOTS: usize = 4096;
static SEEN: [AtomicU64; SEEN_SLOTS] = [const { AtomicU64::new(0) }; SEEN_SLOTS];
static REWRITTEN: AtomicU64 = AtomicU64::new(0);
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// Counts of the sites looked at.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RewriteStats {
    pub rewritten: u64,
    pub refused: u64,
}

pub(crate) fn stats() -> RewriteStats {
    RewriteStats {
        rewritten: REWRITTEN.load(Ordering::Relaxed),
        refused: REFUSED.load(Ordering::Relaxed),
    }
}

fn slot_of(key: u64, slots: usize) -> usize {
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - slots.trailing_zeros())) as usize
}

/// Adds `key` to an open-addressed set; false when it is full.
fn insert(set: &[AtomicU64], key: u64) -> bool {
    let mut i = slot_of(key, set.len());
    for _ in 0..set.len() {
        match set[i].compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(k) if k == key => return true,
            Err(_) => i = (i + 1) % set.len(),
        }
    }
    false
}

fn contains(set: &[AtomicU64], key: u64) -> bool {
    let mut i = slot_of(key, set.len());
    for _ in 0..set.len() {
        match set[i].load(Ordering::Acquire) {
            0 => return false,
            k if k == key => return true,
            _ => i = (i + 1) % set.len(),
        }
    }
    false
}

/// Offers the `syscall` instruction at `site` for rewriting. Async-signal-safe.
pub(crate) fn offer(site: usize) {
    if !FAST.load(Ordering::Acquire) || contains(&SEEN, site as u64) {
        return;
    }
    if QUEUE.iter().any(|q| q.load(Ordering::Relaxed) == site) {
        return;
    }
    for q in &QUEUE {
        if q.compare_exchange(0, site, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            OFFERS.fetch_add(1, Ordering::Release);
            // SAFETY: FUTEX_WAKE_PRIVATE on a word of ours, from our range.
            unsafe {
                raw(
                    libc::SYS_futex as u64,
                    OFFERS.as_ptr() as u64,
                    (libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG) as u64,
                    1,
                    0,
                    0,
                    0,
                )
            };
            return;
        }
    }
}

/// Set to `0` in a target's environment to keep every call on the signal (to measure it,
/// or to keep page 0 unmapped); `1` rewrites sites even where page 0 would be readable.
pub const NO_REWRITE_ENV: &str = "BPFTIME_SYSCALL_REWRITE";

/// The protection key smaps gives the mapping that starts at `start` (`None`: no such
/// mapping, or a kernel without protection keys, which prints no such line).
fn protection_key(smaps: &str, start: usize) -> Option<u32> {
    let head = format!("{start:08x}-");
    let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&head));
    lines.next()?;
    lines
        // The next mapping's header ends this one's fields.
        .take_while(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|f| f.ends_with(':'))
        })
        .find_map(|l| l.strip_prefix("ProtectionKey:"))
        .and_then(|k| k.trim().parse().ok())
}

const GROUP: [u8; 15] = [
    0x2e, 0x2e, 0x2e, 0x2e, 0x2e, 0x2e, 0x2e, 0x2e, 0x2e, 0x2e, 0xb9, 0x90, 0x90, 0x90, 0x90,
];
const PAGE: usize = 4096;

/// The page at 0: a sled from every number below the entry's table into a jump to the
/// entry, and another from every larger one up to the end of the page.
fn sled(entry: usize) -> Vec<u8> {
    let jump = |out: &mut Vec<u8>| {
        out.extend_from_slice(&[0x49, 0xbb]);
        out.extend_from_slice(&(entry as u64).to_le_bytes());
        out.extend_from_slice(&[0x41, 0xff, 0xe3]);
    };
    let mut out = Vec::with_capacity(PAGE);
    while out.len() < crate::NR_LIMIT {
        out.extend_from_slice(&GROUP);
    }
    jump(&mut out);
    while out.len() + GROUP.len() + 13 <= PAGE {
        out.extend_from_slice(&GROUP);
    }
    jump(&mut out);
    out.resize(PAGE, 0xcc);
    out
}

/// Maps the sled at 0 and starts the rewriter; why not, when it cannot be.
pub(crate) fn start() -> Result<(), String> {
    static STARTED: OnceLock<Result<(), String>> = OnceLock::new();
    STARTED
        .get_or_init(|| {
            if std::env::var_os(NO_REWRITE_ENV).is_some_and(|v| v == "0") {
                return Err(format!("{NO_REWRITE_ENV}=0 in the environment"));
            }
            // SAFETY: a fresh anonymous mapping at 0, refused if anything is there already.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    PAGE,
                    libc::PROT_EXEC,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED || !p.is_null() {
                let why = std::io::Error::last_os_error();
                if p != libc::MAP_FAILED {
                    // SAFETY: the mapping just made, elsewhere than asked.
                    unsafe { libc::munmap(p, PAGE) };
                }
                return Err(format!(
                    "the page at address 0 cannot be mapped ({why}; it needs root or vm.mmap_min_addr=0)"
                ));
            }
            let forced = std::env::var_os(NO_REWRITE_ENV).is_some_and(|v| v == "1");
            let execute_only = std::fs::read_to_string("/proc/self/smaps")
                .ok()
                .and_then(|m| protection_key(&m, 0))
                .is_some_and(|k| k != 0);
            if !execute_only && !forced {
                // SAFETY: the page mapped above, which nothing uses yet.
                unsafe { libc::munmap(std::ptr::null_mut(), PAGE) };
                return Err(format!(
                    "the page at address 0 would be readable on this CPU (no protection keys), so null pointer reads in the target would stop faulting; {NO_REWRITE_ENV}=1 accepts that for speed"
                ));
            }
            // Written as code is, through /proc/self/mem: never writable and executable.
            write_code(0, &sled(entry::entry_call())).map_err(|e| e.to_string())?;
            std::thread::Builder::new()
                .name("bpftime-syscalls".into())
                .spawn(rewriter)
                .map_err(|e| format!("cannot start the thread that rewrites sites: {e}"))?;
            FAST.store(true, Ordering::Release);
            Ok(())
        })
        .clone()
}

fn rewriter() {
    bpftime_attach::never_run_handlers_on_this_thread();
    let mut seen_offers = 0;
    loop {
        let now = OFFERS.load(Ordering::Acquire);
        if now == seen_offers {
            let timeout = libc::timespec {
                tv_sec: 1,
                tv_nsec: 0,
            };
            // SAFETY: FUTEX_WAIT_PRIVATE on our word with a live timeout.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    OFFERS.as_ptr(),
                    libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                    now,
                    &timeout,
                )
            };
            continue;
        }
        seen_offers = now;
        for q in &QUEUE {
            let site = q.swap(0, Ordering::AcqRel);
            if site == 0 || !insert(&SEEN, site as u64) {
                continue;
            }
            match rewrite(site) {
                Ok(()) => {
                    REWRITTEN.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(
                        site = format_args!("{site:#x}"),
                        "system call site rewritten"
                    );
                }
                Err(why) => {
                    REFUSED.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(
                        site = format_args!("{site:#x}"),
                        "system call site stays on SIGSYS: {why}"
                    );
                }
            }
        }
    }
}

fn rewrite(site: usize) -> Result<(), String> {
    if read_code(site, 2).map_err(|e| e.to_string())? != [0x0f, 0x05] {
        return Err("not a syscall instruction".into());
    }
    let (start, end) = function_bounds(site).ok_or("no unwind entry covers it")?;
    let code = read_code(start, end - start).map_err(|e| e.to_string())?;
    if let Some(at) = red_zone_use(&code, start) {
        return Err(format!(
            "its function addresses below its stack pointer at {at:#x}"
        ));
    }
    if !insert(&SITES[..SITE_SLOTS], site as u64 + 2) {
        return Err("the table of rewritten sites is full".into());
    }
    register_trap(site, site).map_err(|e| e.to_string())?;
    let mem = Mem::open()?;
    mem.poke(site, 0xcc)?;
    mem.poke(site + 1, 0xd0)?;
    mem.poke(site, 0xff)
}

/// `/proc/self/mem` through system calls of our own: the site being rewritten may be the
/// C library's `syscall()` or `pwrite64`, which every thread (this one too) would meet
/// as an `int3` until the rewrite is done.
struct Mem(i64);

impl Mem {
    fn open() -> Result<Mem, String> {
        // SAFETY: openat of a NUL-terminated path from our range.
        let fd = unsafe {
            raw(
                libc::SYS_openat as u64,
                libc::AT_FDCWD as u64,
                c"/proc/self/mem".as_ptr() as u64,
                (libc::O_RDWR | libc::O_CLOEXEC) as u64,
                0,
                0,
                0,
            )
        };
        if fd < 0 {
            return Err(format!("cannot open /proc/self/mem: errno {}", -fd));
        }
        Ok(Mem(fd))
    }

    /// Writes one byte of code (atomically, being one) and makes every thread serialize.
    fn poke(&self, addr: usize, byte: u8) -> Result<(), String> {
        let b = [byte];
        // SAFETY: pwrite64 from a live byte to our own descriptor, from our range.
        let n = unsafe {
            raw(
                libc::SYS_pwrite64 as u64,
                self.0 as u64,
                b.as_ptr() as u64,
                1,
                addr as u64,
                0,
                0,
            )
        };
        if n != 1 {
            return Err(format!("cannot write code at {addr:#x}: errno {}", -n));
        }
        const SYNC_CORE: u64 = 1 << 5;
        // SAFETY: membarrier takes no pointers; without the registration `write_code`
        // made it fails harmlessly, and x86's coherent fetch sees the store anyway.
        unsafe { raw(libc::SYS_membarrier as u64, SYNC_CORE, 0, 0, 0, 0, 0) };
        Ok(())
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        // SAFETY: our own descriptor.
        unsafe { raw(libc::SYS_close as u64, self.0 as u64, 0, 0, 0, 0, 0) };
    }
}

/// The first instruction in `code` (at `ip`) that addresses memory below the stack
/// pointer, if any.
fn red_zone_use(code: &[u8], ip: usize) -> Option<usize> {
    let mut d = Decoder::with_ip(64, code, ip as u64, DecoderOptions::NONE);
    while d.can_decode() {
        let i = d.decode();
        let memory = (0..i.op_count()).any(|n| i.op_kind(n) == OpKind::Memory);
        if memory && i.memory_base() == Register::RSP && (i.memory_displacement64() as i64) < 0 {
            return Some(i.ip() as usize);
        }
    }
    None
}

/// The bounds of the function holding `addr`, from the `.eh_frame` of the object that
/// maps it (found through its `PT_GNU_EH_FRAME` header, as unwinders do).
fn function_bounds(addr: usize) -> Option<(usize, usize)> {
    use gimli::{BaseAddresses, EhFrame, EhFrameHdr, NativeEndian, Pointer, UnwindSection};
    struct Search {
        addr: usize,
        hdr: Option<(usize, usize)>,
        loads: Vec<(usize, usize)>,
    }
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: dl_iterate_phdr hands us its info and our own `Search`.
        let (info, search) = unsafe { (&*info, &mut *data.cast::<Search>()) };
        // SAFETY: the loader's program headers for this object.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        let base = info.dlpi_addr as usize;
        let loads: Vec<(usize, usize)> = phdrs
            .iter()
            .filter(|p| p.p_type == libc::PT_LOAD)
            .map(|p| {
                (
                    base + p.p_vaddr as usize,
                    base + (p.p_vaddr + p.p_memsz) as usize,
                )
            })
            .collect();
        if !loads.iter().any(|&(s, e)| (s..e).contains(&search.addr)) {
            return 0;
        }
        search.hdr = phdrs
            .iter()
            .find(|p| p.p_type == libc::PT_GNU_EH_FRAME)
            .map(|p| (base + p.p_vaddr as usize, p.p_memsz as usize));
        search.loads = loads;
        1
    }
    let mut search = Search {
        addr,
        hdr: None,
        loads: Vec::new(),
    };
    // SAFETY: the callback only reads the loader's structures and writes our `Search`.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut search as *mut Search).cast()) };
    let (hdr, hdr_len) = search.hdr?;
    // SAFETY: the object's PT_GNU_EH_FRAME segment, mapped readable while it is loaded
    // (our caller holds a site in it, so it stays).
    let hdr_bytes = unsafe { std::slice::from_raw_parts(hdr as *const u8, hdr_len) };
    let bases = BaseAddresses::default().set_eh_frame_hdr(hdr as u64);
    let parsed = EhFrameHdr::new(hdr_bytes, NativeEndian)
        .parse(&bases, 8)
        .ok()?;
    let Pointer::Direct(frames) = parsed.eh_frame_ptr() else {
        return None;
    };
    let frames = frames as usize;
    let end = search
        .loads
        .iter()
        .find(|&&(s, e)| (s..e).contains(&frames))?
        .1;
    // SAFETY: `.eh_frame`, to the end of the loaded segment that holds it.
    let frame_bytes = unsafe { std::slice::from_raw_parts(frames as *const u8, end - frames) };
    let eh_frame = EhFrame::new(frame_bytes, NativeEndian);
    let bases = bases.set_eh_frame(frames as u64);
    let fde = parsed
        .table()?
        .fde_for_address(&eh_frame, &bases, addr as u64, EhFrame::cie_from_offset)
        .ok()?;
    let start = fde.initial_address() as usize;
    Some((start, start + fde.len() as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_protection_key_of_page_zero_is_read_from_smaps() {
        let smaps = "00000000-00001000 --xp 00000000 00:00 0 \n\
Size:                  4 kB\n\
VmFlags: ex mr mw me \n\
ProtectionKey:         1\n\
55d0c0000000-55d0c0001000 r--p 00000000 fd:01 42   /bin/x\n\
ProtectionKey:         0\n";
        assert_eq!(super::protection_key(smaps, 0), Some(1));
        let no_key = "00000000-00001000 --xp 00000000 00:00 0 \nSize: 4 kB\n\
55d0c0000000-55d0c0001000 r--p 00000000 fd:01 42   /bin/x\nProtectionKey: 3\n";
        assert_eq!(
            super::protection_key(no_key, 0),
            None,
            "another mapping's key"
        );
        assert_eq!(super::protection_key("", 0), None);
    }

    #[test]
    fn every_sled_byte_slides_to_a_jump_to_the_entry() {
        let entry = 0x7f12_3456_7890usize;
        let page = sled(entry);
        assert_eq!(page.len(), PAGE);
        // From any address that a number below the page's end may name.
        for start in [0usize, 1, 9, 10, 11, 14, 39, 257, 435, 511, 600, 4000] {
            let mut d = Decoder::with_ip(64, &page[start..], start as u64, DecoderOptions::NONE);
            let mut steps = 0;
            loop {
                let i = d.decode();
                assert!(
                    !i.is_invalid(),
                    "invalid instruction at {:#x} from {start}",
                    i.ip()
                );
                if i.code() == iced_x86::Code::Mov_r64_imm64 {
                    assert_eq!(i.immediate64(), entry as u64);
                    assert_eq!(d.decode().code(), iced_x86::Code::Jmp_rm64);
                    break;
                }
                // Nothing on the way touches memory or the status flags, or writes a
                // register but rcx.
                let memory = (0..i.op_count()).any(|n| i.op_kind(n) == OpKind::Memory);
                assert!(!memory, "{:?} at {:#x}", i.code(), i.ip());
                assert!(
                    matches!(
                        i.mnemonic(),
                        iced_x86::Mnemonic::Nop | iced_x86::Mnemonic::Mov
                    ),
                    "{:?}",
                    i.code()
                );
                if i.mnemonic() == iced_x86::Mnemonic::Mov {
                    assert_eq!(i.op0_register(), Register::ECX, "{:?}", i.code());
                }
                steps += 1;
                assert!(steps < 300);
            }
            if start < crate::NR_LIMIT {
                assert!(
                    steps <= 4 + crate::NR_LIMIT / GROUP.len() + 1,
                    "{steps} from {start}"
                );
            }
        }
    }

    #[test]
    fn red_zone_stores_are_found() {
        // mov [rsp-8], rdi; mov eax, 1; syscall; ret
        let leaf = [
            0x48, 0x89, 0x7c, 0x24, 0xf8, 0xb8, 1, 0, 0, 0, 0x0f, 0x05, 0xc3,
        ];
        assert_eq!(red_zone_use(&leaf, 0x1000), Some(0x1000));
        // sub rsp, 8; mov [rsp], rdi; syscall; add rsp, 8; ret
        let framed = [
            0x48, 0x83, 0xec, 0x08, 0x48, 0x89, 0x3c, 0x24, 0x0f, 0x05, 0x48, 0x83, 0xc4, 0x08,
            0xc3,
        ];
        assert_eq!(red_zone_use(&framed, 0x1000), None);
    }

    #[test]
    fn the_c_librarys_functions_have_bounds() {
        let getppid = libc::getppid as *const () as usize;
        let (start, end) = function_bounds(getppid).expect("libc has unwind tables");
        assert!(start <= getppid && getppid < end, "{start:#x}..{end:#x}");
        assert!(end - start < 4096);
    }
}
