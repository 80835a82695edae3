//! The object path of `bpftime verify` (and `run`): a mutated ELF object opened
//! with libbpf in this process, one of its programs loaded (as `verify` loads
//! them, one at a time, with the verifier's log asked for), every `bpf()` libbpf
//! makes served by the shim in a private store.
//!
//! libbpf reaches the kernel through libc's `syscall()`; this binary defines its
//! own, which the static libbpf binds to at link time, handing `bpf()` to the shim
//! and everything else to libc's: what the preloaded shim does in `bpftime
//! verify`'s loader. The libbpf is the one the CLI links (libbpf-sys, vendored,
//! static); Debian's libbpf 1.1 crashes on objects the newer one refuses with a
//! message. `mmap` and `close` are not interposed: the shim is made anew for each
//! input, so no descriptor outlives the object that libbpf closed.

#![no_main]

use bpftime_fuzz::private_store_root;
use bpftime_runtime::Store;
use bpftime_shim::Shim;
use libc::{c_char, c_int, c_long};
use libfuzzer_sys::fuzz_target;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use libbpf_sys::{
    __va_list_tag, bpf_object__close, bpf_object__load, bpf_object__next_program,
    bpf_object__open_mem, bpf_program__set_autoload, bpf_program__set_log_buf,
    bpf_program__set_log_level, libbpf_print_level, libbpf_set_print,
};

static SHIM: Mutex<Option<Shim>> = Mutex::new(None);
static REAL_SYSCALL: AtomicUsize = AtomicUsize::new(0);

type SyscallFn =
    unsafe extern "C" fn(c_long, c_long, c_long, c_long, c_long, c_long, c_long) -> c_long;

fn real_syscall() -> SyscallFn {
    let mut p = REAL_SYSCALL.load(Ordering::Relaxed);
    if p == 0 {
        // SAFETY: a NUL-terminated name; RTLD_NEXT finds libc's definition after ours.
        p = unsafe { libc::dlsym(libc::RTLD_NEXT, c"syscall".as_ptr()) } as usize;
        assert!(p != 0, "libc's syscall() not found");
        REAL_SYSCALL.store(p, Ordering::Relaxed);
    }
    // SAFETY: p is libc's syscall(), called with the register arguments it takes.
    unsafe { std::mem::transmute::<usize, SyscallFn>(p) }
}

/// libbpf's `syscall()`: `bpf()` to the shim, the rest to libc.
///
/// # Safety
/// As `syscall(2)`.
#[no_mangle]
pub unsafe extern "C" fn syscall(
    num: c_long,
    a1: c_long,
    a2: c_long,
    a3: c_long,
    a4: c_long,
    a5: c_long,
    a6: c_long,
) -> c_long {
    if num == libc::SYS_bpf {
        let mut guard = SHIM.lock().unwrap_or_else(|p| p.into_inner());
        // Never the kernel's bpf(): the fuzzer runs as root.
        let Some(shim) = guard.as_mut() else {
            // SAFETY: errno is this thread's.
            unsafe { *libc::__errno_location() = libc::ENOSYS };
            return -1;
        };
        {
            // SAFETY: libbpf's attribute, with libbpf's pointers in it (caller obligation).
            let r = unsafe { shim.bpf(a1 as u32, a2 as *mut u8, a3 as usize) };
            return match r {
                Ok(v) => v as c_long,
                Err(errno) => {
                    // SAFETY: errno is this thread's.
                    unsafe { *libc::__errno_location() = errno };
                    -1
                }
            };
        }
    }
    // SAFETY: forwarded unchanged.
    unsafe { real_syscall()(num, a1, a2, a3, a4, a5, a6) }
}

unsafe extern "C" fn quiet(
    _: libbpf_print_level,
    _: *const c_char,
    _: *mut __va_list_tag,
) -> c_int {
    0
}

/// Room for the verifier's log of one program at level 1.
const LOG_SIZE: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    private_store_root();
    // SAFETY: a function that ignores its arguments.
    unsafe { libbpf_set_print(Some(quiet)) };
    let Some((&pick, elf)) = data.split_first() else {
        return;
    };
    let name = "verify";
    let dir = Store::dir_for(name);
    let _ = std::fs::remove_dir_all(&dir);
    let store = Store::create_or_open(name).expect("create the verify store");
    *SHIM.lock().unwrap() = Some(Shim::new(store));
    let mut log = vec![0u8; LOG_SIZE];
    // SAFETY: elf outlives the object (libbpf copies what it keeps).
    let obj =
        unsafe { bpf_object__open_mem(elf.as_ptr().cast(), elf.len() as _, std::ptr::null()) };
    if !obj.is_null() {
        // One program of the object, as `bpftime verify` loads each on its own.
        let mut progs = Vec::new();
        let mut p = std::ptr::null_mut();
        loop {
            // SAFETY: obj is open; p is null or one of its programs.
            p = unsafe { bpf_object__next_program(obj, p) };
            if p.is_null() {
                break;
            }
            progs.push(p);
        }
        if !progs.is_empty() {
            let chosen = pick as usize % progs.len();
            for (i, &p) in progs.iter().enumerate() {
                // SAFETY: programs of the open object; log outlives the load.
                unsafe {
                    bpf_program__set_autoload(p, i == chosen);
                    if i == chosen {
                        bpf_program__set_log_level(p, 1);
                        bpf_program__set_log_buf(p, log.as_mut_ptr().cast(), log.len() as _);
                    }
                }
            }
            // SAFETY: an open object.
            let _ = unsafe { bpf_object__load(obj) };
        }
        // SAFETY: opened above, closed once.
        unsafe { bpf_object__close(obj) };
    }
    drop(SHIM.lock().unwrap().take());
    let _ = std::fs::remove_dir_all(&dir);
});
