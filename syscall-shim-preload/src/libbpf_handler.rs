//! `SEC("cuda:...")` in unmodified libbpf tools.
//!
//! libbpf refuses a section name it has no handler for ("missing BPF prog
//! type"). The shim lives in the tool's process, so before the tool's `main`
//! it registers a handler in each libbpf the process has: Debian's shared
//! `libbpf.so.1`, and a libbpf linked statically into the executable (as
//! libbpf-rs links its vendored copy), found in the executable's own symbol
//! table. Each handler calls back into the same libbpf it was registered in.
//!
//! libbpf matches a registered section prefix only up to a `/` or exactly, so
//! `cuda:KERNEL` can only be caught by the catch-all handler (section NULL),
//! registered with no program type: sections that are not `cuda:` ones stay
//! unknown to libbpf, as before. (There is one catch-all handler per libbpf:
//! a tool registering its own gets EBUSY, since ours comes first.) For a
//! `cuda:` section the handler
//!
//! - at open, makes the program a kprobe program, so that `PT_REGS_PARM1(ctx)`
//!   is verified against a pt_regs context;
//! - before the load, names the program to the shim as a GPU program (entry,
//!   exit and memory-access probes), so `BPF_PROG_LOAD` checks it under the GPU
//!   rules and a rejection lands in libbpf's log buffer;
//! - at attach, attaches an entry or exit probe through that libbpf's own
//!   `bpf_program__attach_kprobe_opts` (a kprobe or kretprobe on the kernel
//!   name: the shim's kprobe PMU makes it a GPU link), and a launch or
//!   memory-access probe through `bpf_program__attach_perf_event_opts` on a
//!   kprobe event with bpftime's launch or access bit (see
//!   `bpftime_runtime::GPU_LAUNCH_CONFIG_BIT`),
//!   so every GPU link is a perf-event link, detached when libbpf destroys it.
//!
//! A libbpf without `libbpf_register_prog_handler` (older than 0.8, or a static
//! copy whose linker dropped the unused function) gets no handler: `cuda:`
//! sections then fail to load as before; `cuda__*` kprobe programs still work.

use crate::preload::with_shim;
use bpftime_runtime::{parse_cuda_section, GpuAttachPoint, GpuProbeKind};
use std::ffi::{c_char, c_int, c_long, c_void, CStr, CString};
use std::sync::OnceLock;

const BPF_PROG_TYPE_UNSPEC: c_int = 0;
const BPF_PROG_TYPE_KPROBE: c_int = 2;

/// `struct libbpf_prog_handler_opts` (libbpf 0.8 and later).
#[repr(C)]
struct ProgHandlerOpts {
    sz: usize,
    cookie: c_long,
    prog_setup_fn: Option<unsafe extern "C" fn(*mut c_void, c_long) -> c_int>,
    prog_prepare_load_fn: Option<unsafe extern "C" fn(*mut c_void, *mut c_void, c_long) -> c_int>,
    prog_attach_fn: Option<unsafe extern "C" fn(*const c_void, c_long, *mut *mut c_void) -> c_int>,
}

/// `struct bpf_kprobe_opts` as libbpf 1.2 and later declare it. `sz` is 32
/// with or without `attach_mode` (the padding after `retprobe`), so libbpf
/// 1.2+ reads `attach_mode` whatever we declare: it must be there, and 0
/// (`PROBE_ATTACH_MODE_DEFAULT`), or a stray padding byte makes the attach
/// fail with EINVAL and no message. libbpf 1.1 ends its struct at the same
/// size and never reads it.
#[repr(C)]
struct KprobeOpts {
    sz: usize,
    bpf_cookie: u64,
    offset: usize,
    retprobe: bool,
    /// Padding, named so that it is zero: libbpf 1.1, which ends its struct at
    /// `retprobe`, refuses options whose bytes past its own end are not all zero
    /// ("bpf_kprobe_opts has non-zero extra bytes"), and an unnamed padding byte holds
    /// whatever the stack held.
    _pad: [u8; 3],
    attach_mode: c_int,
}

// libbpf reads `attach_mode` at offset 28 of a 32-byte `bpf_kprobe_opts`.
const _: () = assert!(std::mem::size_of::<KprobeOpts>() == 32);
const _: () = assert!(std::mem::offset_of!(KprobeOpts, attach_mode) == 28);

type RegisterFn =
    unsafe extern "C" fn(*const c_char, c_int, c_int, *const ProgHandlerOpts) -> c_int;
type ProgStrFn = unsafe extern "C" fn(*const c_void) -> *const c_char;
type SetTypeFn = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;
type AttachKprobeFn =
    unsafe extern "C" fn(*const c_void, *const c_char, *const KprobeOpts) -> *mut c_void;
type AttachPerfEventFn = unsafe extern "C" fn(*const c_void, c_int, *const c_void) -> *mut c_void;

/// The functions of one libbpf that the handler uses.
#[derive(Clone, Copy)]
struct Libbpf {
    register: RegisterFn,
    name: ProgStrFn,
    section_name: ProgStrFn,
    set_type: SetTypeFn,
    attach_kprobe_opts: AttachKprobeFn,
    attach_perf_event_opts: AttachPerfEventFn,
}

const SYMBOLS: [&str; 6] = [
    "libbpf_register_prog_handler",
    "bpf_program__name",
    "bpf_program__section_name",
    "bpf_program__set_type",
    "bpf_program__attach_kprobe_opts",
    "bpf_program__attach_perf_event_opts",
];

impl Libbpf {
    /// The functions from their addresses, in [`SYMBOLS`] order; None if any is missing.
    ///
    /// # Safety
    /// Each non-zero address must be the named libbpf function.
    unsafe fn from_addresses(a: [usize; 6]) -> Option<Libbpf> {
        if a.contains(&0) {
            return None;
        }
        // SAFETY: caller obligation: each address is the function named in SYMBOLS,
        // whose C signature libbpf.h declares as these types.
        unsafe {
            Some(Libbpf {
                register: std::mem::transmute::<usize, RegisterFn>(a[0]),
                name: std::mem::transmute::<usize, ProgStrFn>(a[1]),
                section_name: std::mem::transmute::<usize, ProgStrFn>(a[2]),
                set_type: std::mem::transmute::<usize, SetTypeFn>(a[3]),
                attach_kprobe_opts: std::mem::transmute::<usize, AttachKprobeFn>(a[4]),
                attach_perf_event_opts: std::mem::transmute::<usize, AttachPerfEventFn>(a[5]),
            })
        }
    }
}

/// The libbpfs a handler was registered in; the handler's cookie is the index.
static LIBBPFS: [OnceLock<Libbpf>; 2] = [OnceLock::new(), OnceLock::new()];

fn libbpf(cookie: c_long) -> Option<&'static Libbpf> {
    LIBBPFS.get(usize::try_from(cookie).ok()?)?.get()
}

/// Registers the handler in every libbpf of this process, before `main`.
#[used]
#[link_section = ".init_array"]
static REGISTER_AT_START: extern "C" fn() = register_handlers;

extern "C" fn register_handlers() {
    bpftime_ffi_guard::ffi_guard!("libbpf handler registration", (), register_all());
}

fn register_all() {
    bpftime_runtime::init_logging();
    let shared = shared_libbpf();
    if let Some(l) = shared {
        register(l, "libbpf.so.1");
    }
    match static_libbpf() {
        // The executable may export the very functions the shared lookup found.
        Some(l) if shared.is_some_and(|s| s.register as usize == l.register as usize) => {}
        Some(l) => register(l, "the executable's static libbpf"),
        None => {}
    }
}

fn register(l: Libbpf, origin: &str) {
    let Some(slot) = LIBBPFS.iter().position(|s| s.get().is_none()) else {
        return;
    };
    if LIBBPFS[slot].set(l).is_err() {
        return;
    }
    let opts = ProgHandlerOpts {
        sz: std::mem::size_of::<ProgHandlerOpts>(),
        cookie: slot as c_long,
        prog_setup_fn: Some(setup),
        prog_prepare_load_fn: Some(prepare_load),
        prog_attach_fn: Some(attach),
    };
    // SAFETY: libbpf's registration copies the options; a NULL section asks for
    // the catch-all handler. Called before main, when nothing else calls libbpf.
    let id = unsafe {
        (l.register)(
            std::ptr::null(),
            BPF_PROG_TYPE_UNSPEC,
            0,
            &opts as *const ProgHandlerOpts,
        )
    };
    if id < 0 {
        // -EBUSY: this libbpf already has a catch-all handler.
        tracing::debug!(
            origin,
            errno = -id,
            "cannot register the cuda: section handler"
        );
    } else {
        tracing::debug!(origin, "cuda: section handler registered");
    }
}

/// Debian's shared libbpf, when the process has it loaded.
fn shared_libbpf() -> Option<Libbpf> {
    // SAFETY: RTLD_NOLOAD only looks the library up; the handle is released below.
    let handle =
        unsafe { libc::dlopen(c"libbpf.so.1".as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    if handle.is_null() {
        return None;
    }
    let mut addrs = [0usize; 6];
    for (a, name) in addrs.iter_mut().zip(SYMBOLS) {
        let c = CString::new(name).ok()?;
        // SAFETY: a valid handle and a NUL-terminated name.
        *a = unsafe { libc::dlsym(handle, c.as_ptr()) } as usize;
    }
    // SAFETY: the handle came from dlopen; the library stays loaded, since the
    // executable (or another library) needs it.
    unsafe { libc::dlclose(handle) };
    // SAFETY: the addresses are libbpf's exported functions of those names.
    unsafe { Libbpf::from_addresses(addrs) }
}

/// A libbpf linked into the executable itself, from its `.symtab` (static
/// functions are not in the dynamic symbol table). None without a symbol table.
fn static_libbpf() -> Option<Libbpf> {
    let file = std::fs::File::open("/proc/self/exe").ok()?;
    let len = file.metadata().ok()?.len() as usize;
    // SAFETY: a private read-only mapping of our own executable, unmapped below;
    // the executable file is not written while it runs (ETXTBSY).
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: the mapping above, `len` bytes, alive until the munmap below.
    let bytes = unsafe { std::slice::from_raw_parts(base.cast::<u8>(), len) };
    let found = symtab_addresses(bytes, SYMBOLS);
    // SAFETY: unmaps the mapping made above; nothing borrows it any more.
    unsafe { libc::munmap(base, len) };
    let offsets = found?;
    let bias = load_bias();
    let addrs = offsets.map(|o| if o == 0 { 0 } else { o + bias });
    // SAFETY: the addresses are the executable's defined functions of those names.
    unsafe { Libbpf::from_addresses(addrs) }
}

/// The values of the functions `names` in an ELF file's `.symtab` (0 for
/// missing ones); None when the file has no symbol table.
fn symtab_addresses<const N: usize>(bytes: &[u8], names: [&str; N]) -> Option<[usize; N]> {
    use goblin::elf::{section_header::SHN_UNDEF, sym::STT_FUNC, Elf};
    let elf = Elf::parse(bytes).ok()?;
    if elf.syms.is_empty() {
        return None;
    }
    let mut out = [0usize; N];
    for s in elf.syms.iter() {
        if s.st_type() != STT_FUNC || s.st_shndx == SHN_UNDEF as usize || s.st_value == 0 {
            continue;
        }
        let Some(name) = elf.strtab.get_at(s.st_name) else {
            continue;
        };
        if let Some(i) = names.iter().position(|n| *n == name) {
            out[i] = s.st_value as usize;
        }
    }
    Some(out)
}

/// Where the executable is loaded relative to its link-time addresses (0 for a
/// non-PIE executable): the first object `dl_iterate_phdr` reports.
fn load_bias() -> usize {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: the loader passes a valid info; `data` is the usize below.
        unsafe { *data.cast::<usize>() = (*info).dlpi_addr as usize };
        1
    }
    let mut bias = 0usize;
    // SAFETY: the callback writes one usize through `data` and stops the walk.
    unsafe { libc::dl_iterate_phdr(Some(first), (&mut bias as *mut usize).cast()) };
    bias
}

/// The section of `prog`, read as a GPU probe; None for other sections.
///
/// # Safety
/// `prog` must be a program of the libbpf `l`.
unsafe fn probe_of(
    l: &Libbpf,
    prog: *const c_void,
) -> Option<Result<GpuAttachPoint, bpftime_runtime::GpuSectionError>> {
    // SAFETY: caller obligation; libbpf returns the program's own string.
    let section = unsafe { (l.section_name)(prog) };
    if section.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated string owned by the program.
    parse_cuda_section(&unsafe { CStr::from_ptr(section) }.to_string_lossy())
}

/// # Safety
/// As `probe_of`.
unsafe fn name_of(l: &Libbpf, prog: *const c_void) -> String {
    // SAFETY: caller obligation; libbpf returns the program's own string.
    let name = unsafe { (l.name)(prog) };
    if name.is_null() {
        return String::new();
    }
    // SAFETY: a NUL-terminated string owned by the program.
    unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}

fn errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EINVAL)
}

/// At open: a `cuda:` program is a kprobe program.
unsafe extern "C" fn setup(prog: *mut c_void, cookie: c_long) -> c_int {
    // SAFETY: forwarded from libbpf.
    bpftime_ffi_guard::ffi_guard!("libbpf prog setup", -libc::EINVAL, unsafe {
        setup_inner(prog, cookie)
    })
}

/// # Safety
/// `prog` is a program of the libbpf registered under `cookie`.
unsafe fn setup_inner(prog: *mut c_void, cookie: c_long) -> c_int {
    let Some(l) = libbpf(cookie) else { return 0 };
    // SAFETY: libbpf hands us one of its programs.
    if unsafe { probe_of(l, prog) }.is_some() {
        // SAFETY: as above; the object is not loaded yet (this is its open).
        return unsafe { (l.set_type)(prog, BPF_PROG_TYPE_KPROBE) };
    }
    0
}

/// Before the load: GPU programs are named to the shim; a `cuda:` section naming no kernel
/// is refused.
unsafe extern "C" fn prepare_load(prog: *mut c_void, _opts: *mut c_void, cookie: c_long) -> c_int {
    // SAFETY: forwarded from libbpf.
    bpftime_ffi_guard::ffi_guard!("libbpf prog prepare_load", -libc::EINVAL, unsafe {
        prepare_load_inner(prog, cookie)
    })
}

/// # Safety
/// `prog` is a program of the libbpf registered under `cookie`.
unsafe fn prepare_load_inner(prog: *mut c_void, cookie: c_long) -> c_int {
    let Some(l) = libbpf(cookie) else { return 0 };
    // SAFETY: libbpf hands us one of its programs.
    let (probe, name) = unsafe { (probe_of(l, prog), name_of(l, prog)) };
    match probe {
        Some(Ok(p)) if p.kind.on_gpu() => match with_shim(|s| s.expect_gpu_program(&name)) {
            Ok(()) => 0,
            Err(why) => -why.errno(),
        },
        Some(Err(e)) => {
            tracing::error!("program `{name}`: {e}");
            -libc::EOPNOTSUPP
        }
        _ => 0,
    }
}

/// At attach (a skeleton's attach, or `bpf_program__attach`).
unsafe extern "C" fn attach(prog: *const c_void, cookie: c_long, link: *mut *mut c_void) -> c_int {
    // SAFETY: forwarded from libbpf.
    bpftime_ffi_guard::ffi_guard!("libbpf prog attach", -libc::EINVAL, unsafe {
        attach_inner(prog, cookie, link)
    })
}

/// # Safety
/// `prog` is a program of the libbpf registered under `cookie`; `link` is
/// NULL or writable.
unsafe fn attach_inner(prog: *const c_void, cookie: c_long, link: *mut *mut c_void) -> c_int {
    if link.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: libbpf passes a valid out pointer.
    unsafe { *link = std::ptr::null_mut() };
    let Some(l) = libbpf(cookie) else { return 0 };
    // SAFETY: libbpf hands us one of its programs.
    let (probe, name) = unsafe { (probe_of(l, prog), name_of(l, prog)) };
    let p = match probe {
        // Not ours: no automatic attach, as for any unknown section.
        None => return 0,
        Some(Err(e)) => {
            tracing::error!("program `{name}`: {e}");
            return -libc::EOPNOTSUPP;
        }
        Some(Ok(p)) => p,
    };
    let Ok(kernel) = CString::new(p.kernel.as_str()) else {
        return -libc::EINVAL;
    };
    let made = match p.kind {
        GpuProbeKind::Entry | GpuProbeKind::Exit => {
            let opts = KprobeOpts {
                sz: std::mem::size_of::<KprobeOpts>(),
                bpf_cookie: 0,
                offset: 0,
                retprobe: p.kind == GpuProbeKind::Exit,
                _pad: [0; 3],
                attach_mode: 0,
            };
            // SAFETY: a program of this libbpf, a NUL-terminated name and valid options.
            unsafe { (l.attach_kprobe_opts)(prog, kernel.as_ptr(), &opts) }
        }
        GpuProbeKind::Launch | GpuProbeKind::Access | GpuProbeKind::SharedAccess => {
            let config = p.kind.event_config().expect("an event of bpftime's");
            let fd = match with_shim(|s| s.gpu_event(&kernel, config)) {
                Ok(Ok(fd)) => fd,
                Ok(Err(e)) => return -e,
                Err(why) => return -why.errno(),
            };
            // SAFETY: a program of this libbpf and our perf event fd, which the link
            // owns (and closes) from here on; NULL options are the defaults.
            let made = unsafe { (l.attach_perf_event_opts)(prog, fd, std::ptr::null()) };
            if made.is_null() {
                let e = errno();
                // SAFETY: our own fd, not taken by a link.
                unsafe { libc::close(fd) };
                return -e;
            }
            made
        }
    };
    if made.is_null() {
        return -errno();
    }
    tracing::info!(prog = %name, kernel = %p.kernel, kind = ?p.kind, "attached a cuda: program");
    // SAFETY: as above.
    unsafe { *link = made };
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test executable has a symbol table and holds the shim's interposers:
    /// one is found there, and the load bias turns its value into the address it
    /// runs at. There is no libbpf in it.
    #[test]
    fn functions_are_found_in_the_executable_at_their_run_time_address() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let [open64_at, missing] =
            symtab_addresses(&exe, ["open64", "libbpf_register_prog_handler"])
                .expect("a symbol table");
        assert_ne!(open64_at, 0);
        assert_eq!(missing, 0);
        assert_eq!(
            open64_at + load_bias(),
            crate::preload::open64 as *const () as usize,
            "symbol value plus load bias must be the function's address"
        );
        assert!(static_libbpf().is_none());
    }
}
