//! The bpffs paths libbpf pins under (`/sys/fs/bpf`), served from the store: pinning's
//! `mkdir`, unpinning's `unlink` and `rmdir`, and `statfs`, which libbpf checks a pin's
//! directory with.

use super::*;

/// The part below `/sys/fs/bpf` of an absolute path there, which the shim serves
/// from the store (see the runtime's `pins.rs`); None for every other path.
///
/// # Safety
/// `path` is null or a NUL-terminated string.
unsafe fn bpffs_path(path: *const libc::c_char) -> Option<std::path::PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    if path.is_null() {
        return None;
    }
    // SAFETY: caller obligation.
    let bytes = unsafe { std::ffi::CStr::from_ptr(path) }.to_bytes();
    if !bytes.starts_with(bpftime_runtime::BPFFS_ROOT.as_bytes()) {
        return None;
    }
    bpftime_runtime::bpffs_relative(std::path::Path::new(std::ffi::OsStr::from_bytes(bytes)))
}

fn ret_int(r: SysResult<()>) -> c_int {
    ret(r.map(|_| 0i64)) as c_int
}

/// For a path in bpffs, the shim's answer: served, or failed when the store cannot be
/// opened (a real pin must not be touched in our place). None for every other path, and
/// for the shim's own calls.
///
/// # Safety
/// `path` is null or a NUL-terminated string.
unsafe fn in_bpffs(
    path: *const libc::c_char,
    f: impl FnOnce(&mut Shim, &std::path::Path) -> SysResult<()>,
) -> Option<c_int> {
    // SAFETY: caller obligation.
    let rel = unsafe { bpffs_path(path) }?;
    match with_shim(|s| f(s, &rel)) {
        Ok(r) => Some(ret_int(r)),
        Err(Unserved::Reentered) => None,
        Err(why) => Some(failed(why.errno())),
    }
}

/// `unlink(2)`: libbpf unpins with it (`bpf_map__unpin`, `bpf_link__unpin`).
///
/// # Safety
/// As `unlink(2)`.
#[no_mangle]
pub unsafe extern "C" fn unlink(path: *const libc::c_char) -> c_int {
    let served = ffi_guard!(
        "unlink",
        Some(failed(INTERNAL_ERROR)),
        // SAFETY: caller obligation.
        unsafe { in_bpffs(path, |s, rel| s.bpffs_unlink(rel, false)) }
    );
    if let Some(r) = served {
        return r;
    }
    let real = real!("unlink", unsafe extern "C" fn(*const libc::c_char) -> c_int);
    // SAFETY: forwards unchanged.
    unsafe { real(path) }
}

/// `unlinkat(2)`, which `rm` uses, for absolute paths in bpffs.
///
/// # Safety
/// As `unlinkat(2)`.
#[no_mangle]
pub unsafe extern "C" fn unlinkat(dirfd: c_int, path: *const libc::c_char, flags: c_int) -> c_int {
    let dir = flags & libc::AT_REMOVEDIR != 0;
    let served = ffi_guard!(
        "unlinkat",
        Some(failed(INTERNAL_ERROR)),
        // SAFETY: caller obligation.
        unsafe { in_bpffs(path, |s, rel| s.bpffs_unlink(rel, dir)) }
    );
    if let Some(r) = served {
        return r;
    }
    let real = real!(
        "unlinkat",
        unsafe extern "C" fn(c_int, *const libc::c_char, c_int) -> c_int
    );
    // SAFETY: forwards unchanged.
    unsafe { real(dirfd, path, flags) }
}

/// `rmdir(2)` in bpffs.
///
/// # Safety
/// As `rmdir(2)`.
#[no_mangle]
pub unsafe extern "C" fn rmdir(path: *const libc::c_char) -> c_int {
    let served = ffi_guard!(
        "rmdir",
        Some(failed(INTERNAL_ERROR)),
        // SAFETY: caller obligation.
        unsafe { in_bpffs(path, |s, rel| s.bpffs_unlink(rel, true)) }
    );
    if let Some(r) = served {
        return r;
    }
    let real = real!("rmdir", unsafe extern "C" fn(*const libc::c_char) -> c_int);
    // SAFETY: forwards unchanged.
    unsafe { real(path) }
}

/// `mkdir(2)`: libbpf makes a pin's directory before pinning.
///
/// # Safety
/// As `mkdir(2)`.
#[no_mangle]
pub unsafe extern "C" fn mkdir(path: *const libc::c_char, mode: libc::mode_t) -> c_int {
    let served = ffi_guard!(
        "mkdir",
        Some(failed(INTERNAL_ERROR)),
        // SAFETY: caller obligation.
        unsafe { in_bpffs(path, |s, rel| s.bpffs_mkdir(rel)) }
    );
    if let Some(r) = served {
        return r;
    }
    let real = real!(
        "mkdir",
        unsafe extern "C" fn(*const libc::c_char, libc::mode_t) -> c_int
    );
    // SAFETY: forwards unchanged.
    unsafe { real(path, mode) }
}

/// The kernel's `BPF_FS_MAGIC`, which libbpf checks a pin's directory for.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// `statfs(2)`: a directory in bpffs is on a BPF filesystem.
///
/// # Safety
/// As `statfs(2)`.
#[no_mangle]
pub unsafe extern "C" fn statfs(path: *const libc::c_char, buf: *mut libc::statfs) -> c_int {
    // The directory in the store that stands for a bpffs path: Ok(None) for other paths
    // and the shim's own calls, Err(errno) for a bpffs path the shim cannot serve.
    let served: Result<Option<std::path::PathBuf>, i32> =
        ffi_guard!("statfs", Err(INTERNAL_ERROR), {
            // SAFETY: caller obligation.
            match unsafe { bpffs_path(path) } {
                None => Ok(None),
                Some(rel) => match with_shim(|s| s.bpffs_dir(&rel)) {
                    Ok(Some(dir)) => Ok(Some(dir)),
                    Ok(None) => Err(libc::ENOENT),
                    Err(Unserved::Reentered) => Ok(None),
                    Err(why) => Err(why.errno()),
                },
            }
        });
    let real = real!(
        "statfs",
        unsafe extern "C" fn(*const libc::c_char, *mut libc::statfs) -> c_int
    );
    match served {
        Err(errno) => failed(errno),
        Ok(Some(dir)) => {
            let c = std::ffi::CString::new(dir.into_os_string().into_encoded_bytes())
                .unwrap_or_default();
            // SAFETY: `c` is a path; `buf` is the caller's out buffer.
            let r = unsafe { real(c.as_ptr(), buf) };
            if r == 0 {
                // SAFETY: statfs succeeded, so `buf` is valid and filled.
                unsafe { (*buf).f_type = BPF_FS_MAGIC as _ };
            }
            r
        }
        // SAFETY: forwards unchanged.
        Ok(None) => unsafe { real(path, buf) },
    }
}

/// `statfs64(3)`, the same as `statfs` on 64-bit targets, which libbpf may call instead.
///
/// # Safety
/// As `statfs(2)`.
#[no_mangle]
pub unsafe extern "C" fn statfs64(path: *const libc::c_char, buf: *mut libc::statfs64) -> c_int {
    // SAFETY: on 64-bit Linux the two structures are one layout (glibc aliases them).
    unsafe { statfs(path, buf.cast()) }
}
