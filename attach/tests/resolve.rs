//! Target resolution against real binaries: libc, this PIE test binary, and C code built
//! here with `cc` (a shared library we then hook, and a non-PIE executable).

use std::ffi::CString;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bpftime_attach::{
    attach_uprobe, attach_uretprobe, detach, is_function_entry, runtime_address,
    symbol_file_offset, AttachError, Location, Target,
};

#[no_mangle]
#[inline(never)]
pub extern "C" fn bpftime_attach_resolve_me(x: u64) -> u64 {
    black_box(x) + 7
}

#[test]
fn malloc_in_libc_resolves_to_the_address_the_linker_gave_us() {
    let want = libc::malloc as *const () as usize;
    let off = symbol_file_offset(Path::new("libc.so.6"), "malloc").unwrap();
    assert_eq!(runtime_address(Path::new("libc.so.6"), off).unwrap(), want);
    let t: Target = "libc.so.6:malloc".parse().unwrap();
    assert_eq!(t.resolve().unwrap(), want);
    let versioned: Target = "libc.so.6:malloc@@GLIBC_2.2.5".parse().unwrap();
    assert_eq!(versioned.resolve().unwrap(), want);
    assert_eq!(
        "libc:free".parse::<Target>().unwrap().resolve().unwrap(),
        libc::free as *const () as usize
    );
}

#[test]
fn symbols_of_this_pie_binary_resolve_and_offsets_round_trip() {
    let exe = std::env::current_exe().unwrap();
    let want = bpftime_attach_resolve_me as *const () as usize;
    let off = symbol_file_offset(&exe, "bpftime_attach_resolve_me").unwrap();
    assert_eq!(runtime_address(&exe, off).unwrap(), want);
    let by_offset: Target = format!("{}:{off:#x}", exe.display()).parse().unwrap();
    assert_eq!(by_offset.location, Location::Offset(off));
    assert_eq!(by_offset.resolve().unwrap(), want);
    assert_eq!(by_offset.to_string().parse::<Target>().unwrap(), by_offset);
    assert_eq!(bpftime_attach_resolve_me(1), 8);
}

#[test]
fn function_entries_are_told_from_offsets_inside_functions() {
    let exe = std::env::current_exe().unwrap();
    let off = symbol_file_offset(&exe, "bpftime_attach_resolve_me").unwrap();
    assert!(is_function_entry(&exe, off).unwrap());
    assert!(!is_function_entry(&exe, off + 1).unwrap());
    let libc = Path::new("libc.so.6");
    let malloc = symbol_file_offset(libc, "malloc").unwrap();
    assert!(is_function_entry(libc, malloc).unwrap());
    assert!(!is_function_entry(libc, malloc + 4).unwrap());
    // An offset no segment holds (past the end of the file) is not a function entry.
    assert!(!is_function_entry(libc, u64::MAX / 2).unwrap());
}

#[test]
fn a_missing_symbol_names_the_binary_and_the_symbol() {
    let exe = std::env::current_exe().unwrap();
    let err = symbol_file_offset(&exe, "no_such_function_here").unwrap_err();
    assert!(
        matches!(&err, AttachError::SymbolNotFound { binary, symbol } if *binary == exe && symbol == "no_such_function_here")
    );
    let text = err.to_string();
    assert!(
        text.contains("no_such_function_here") && text.contains("stripped"),
        "{text}"
    );
}

#[test]
fn a_binary_that_is_not_mapped_is_an_error() {
    let err = runtime_address(Path::new("libnot_loaded_anywhere.so.3"), 0).unwrap_err();
    assert!(matches!(err, AttachError::NotMapped { .. }), "{err}");
    // A real ELF file that this process has not mapped.
    let sh = PathBuf::from("/bin/sh");
    let err = runtime_address(&sh, 0x1000).unwrap_err();
    assert!(
        matches!(&err, AttachError::NotMapped { binary } if *binary == sh),
        "{err}"
    );
    assert!(err.to_string().contains("/proc/self/maps"));
    // Mapped, but no mapping of it holds this offset.
    let exe = std::env::current_exe().unwrap();
    let err = runtime_address(&exe, 1 << 40).unwrap_err();
    assert!(
        matches!(err, AttachError::OffsetNotMapped { offset, .. } if offset == 1 << 40),
        "{err}"
    );
}

/// Builds C code with the system compiler, which these tests need (gcc on our machines).
fn cc(dir: &Path, out: &str, src: &str, args: &[&str]) -> PathBuf {
    let c = dir.join(format!("{out}.c"));
    std::fs::write(&c, src).unwrap();
    let path = dir.join(out);
    let status = Command::new("cc")
        .args(args)
        .arg("-o")
        .arg(&path)
        .arg(&c)
        .status()
        .expect("running `cc`");
    assert!(status.success(), "cc failed to build {}", c.display());
    path
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("bpftime-attach-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const LIB_SRC: &str = r#"
static long total;
long probe_accumulate(long x, long y) {
    total += x;
    return total * y;
}
"#;

#[test]
fn hooks_a_c_shared_library_with_a_rip_relative_prologue() {
    // With and without the `endbr64` that -fcf-protection puts first (Ubuntu's default).
    for cf in ["none", "full"] {
        hook_c_library(cf);
    }
}

fn hook_c_library(cf: &str) {
    let dir = temp_dir(&format!("lib-{cf}"));
    let name = format!("libprobe_{cf}.so");
    let lib = cc(
        &dir,
        &name,
        LIB_SRC,
        &["-O2", "-shared", "-fPIC", &format!("-fcf-protection={cf}")],
    );
    let cpath = CString::new(lib.to_str().unwrap()).unwrap();
    // SAFETY: a library we just built, with no constructors.
    let handle = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW) };
    assert!(!handle.is_null());
    // SAFETY: `handle` is live; the name is NUL-terminated.
    let sym = unsafe { libc::dlsym(handle, c"probe_accumulate".as_ptr()) } as usize;
    assert_ne!(sym, 0);
    let target: Target = format!("{name}:probe_accumulate").parse().unwrap();
    assert_eq!(target.resolve().unwrap(), sym);

    // gcc -O2 opens this function with `mov rax, [rip+total]` (after an `endbr64` where gcc
    // defaults to -fcf-protection): the stolen prologue must be relocated, or `total` would be
    // read from the wrong address.
    // SAFETY: `sym` is the C function's entry, mapped readable, and stays mapped (never dlclosed).
    let opening = unsafe { std::ptr::read(sym as *const [u8; 7]) };
    let endbr64 = [0xf3, 0x0f, 0x1e, 0xfa];
    assert_eq!(opening.starts_with(&endbr64), cf == "full");
    let opening = opening.strip_prefix(&endbr64[..]).unwrap_or(&opening);
    assert_eq!(
        opening[..3],
        [0x48, 0x8b, 0x05],
        "expected an rip-relative load first"
    );
    // SAFETY: `sym` is the C function's entry and stays mapped (never dlclosed).
    let accumulate: extern "C" fn(i64, i64) -> i64 = unsafe { std::mem::transmute(sym) };
    let calls = Arc::new(AtomicU64::new(0));
    let results = Arc::new(Mutex::new(Vec::new()));
    let (c, r) = (calls.clone(), results.clone());
    // SAFETY: as above.
    let ids = unsafe {
        [
            attach_uprobe(
                sym,
                Arc::new(move |regs| {
                    c.fetch_add(regs.di * regs.si, Ordering::Relaxed);
                }),
            )
            .unwrap(),
            attach_uretprobe(
                sym,
                Arc::new(move |regs| r.lock().unwrap().push(regs.ax as i64)),
            )
            .unwrap(),
        ]
    };
    assert_eq!(accumulate(2, 3), 6);
    assert_eq!(accumulate(4, 5), 30);
    for id in ids {
        detach(id).unwrap();
    }
    assert_eq!(accumulate(1, 1), 7);
    assert_eq!(calls.load(Ordering::Relaxed), 26);
    assert_eq!(*results.lock().unwrap(), vec![6, 30]);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn file_offsets_of_a_non_pie_executable_follow_its_load_segments() {
    let dir = temp_dir("nopie");
    let src = "int work(int x) { return x * 3; }\nint main(void) { return work(1) - 3; }\n";
    let exe = cc(&dir, "nopie", src, &["-O1", "-no-pie", "-fno-pie"]);
    let off = symbol_file_offset(&exe, "work").unwrap();
    // GNU ld's default non-PIE layout loads file offset 0 at 0x400000, so the kernel's uprobe
    // offset is the symbol's address minus that base (nm is the independent witness).
    let nm = Command::new("nm").arg(&exe).output().unwrap();
    let nm = String::from_utf8(nm.stdout).unwrap();
    let vaddr = nm
        .lines()
        .find_map(|l| l.strip_suffix(" T work"))
        .map(|a| u64::from_str_radix(a, 16).unwrap())
        .unwrap();
    assert_eq!(off, vaddr - 0x40_0000);
    std::fs::remove_dir_all(dir).ok();
}
