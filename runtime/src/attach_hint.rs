//! The file `bpftime attach` leaves for the process it injects the agent into,
//! `/dev/shm/bpftime-inject-<pid>`: the store to use, and where the agent reports a
//! failure to start. It lies in a directory every user can write to, so it is opened
//! without following a link, never created here, and used only when its owner is root
//! or the caller: a file another user planted names no store for us, and a link cannot
//! make us write to what it points at.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Opens the hint with `flags`, when it is a plain file of root's or ours.
fn open_hint(path: &Path, flags: libc::c_int) -> Option<File> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: NUL-terminated path; no O_CREAT, so no mode.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: just opened, owned by nothing else.
    let file = unsafe { File::from_raw_fd(fd) };
    // SAFETY: stat is plain old data, filled in by the kernel.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `file` is open; `st` is a valid out buffer.
    if unsafe { libc::fstat(file.as_raw_fd(), &mut st) } != 0 {
        return None;
    }
    let me = crate::store_dir::euid();
    let trusted = st.st_uid == 0 || st.st_uid == me;
    (st.st_mode & libc::S_IFMT == libc::S_IFREG && trusted).then_some(file)
}

/// The store name in the hint at `path`; None when there is no usable hint.
pub fn read_attach_hint(path: &Path) -> Option<String> {
    let mut text = String::new();
    open_hint(path, libc::O_RDONLY)?
        .take(256)
        .read_to_string(&mut text)
        .ok()?;
    let name = text.trim().to_string();
    (!name.is_empty()).then_some(name)
}

/// Tells a waiting `bpftime attach` why the agent did not start: only into a hint that
/// is still there (`attach` may have given up and removed it).
pub fn report_to_attach(path: &Path, why: &str) {
    let Some(mut f) = open_hint(path, libc::O_WRONLY) else {
        return;
    };
    if f.set_len(0).is_ok() {
        let _ = f.write_all(format!("error: {why}").as_bytes());
    }
}
