//! When objects die: as in the kernel, an object lives while something refers to it.
//!
//! The references are the kernel's:
//!
//! * a file descriptor, in any process: every descriptor the shim hands out is an open
//!   file description of the object's own file, and it holds an OFD read lock
//!   (`F_OFD_SETLK`) on the file's first byte ([`hold`]);
//! * a pin in the store's `pins/` tree (see `pins.rs`);
//! * another object: a link holds its program and its perf event, a program holds
//!   the maps it uses, a map holds its BTF, a program array holds its programs and a
//!   perf event array its events, and a perf event holds the link that
//!   `PERF_EVENT_IOC_SET_BPF` made on it.
//!
//! Why OFD locks: the kernel drops an OFD lock when the last descriptor sharing that
//! open file description is closed, in whatever way: `close()`, `exec` of a
//! close-on-exec descriptor, exit, or `SIGKILL`. Descriptors duplicated with `dup()`,
//! inherited across `fork()` or passed over a socket share the description and
//! therefore the lock, exactly as they share a kernel BPF object's `struct file`.
//! A count kept in shared memory could not do that: nobody decrements it for a
//! process that is killed. Unlike `flock()` or classic POSIX locks, OFD locks are
//! neither dropped by closing some other descriptor of the same file nor merged
//! between two descriptions in one process, and whether anyone holds one can be
//! asked without taking it (`F_OFD_GETLK`).
//!
//! Collection (`bpftime-maps`' `collect_garbage`) is a mark and sweep: the roots are the
//! objects whose file some description holds and the pinned ones; everything they
//! reach lives, the rest is unlinked (processes that still map a freed map keep their
//! mapping, as a kernel map outlives its fd while a program uses it). It runs after
//! the shim closes an object's descriptor, when a shim starts, before `bpftime list`
//! and in every agent's watch loop (which is what notices a killed tool).
//!
//! A mark and sweep is only right if nobody adds a reference that it cannot see while
//! it runs: a process holding a map's descriptor could load a program that uses the
//! map and close the descriptor between the collector's reading of the programs and
//! its look at the map. So everything that makes a reference (creating an object and
//! its descriptor, opening a descriptor by id or by pin, pinning, a link, a program
//! array entry) holds the store lock shared ([`Store::hold_refs`]), and the collector
//! holds it exclusively. Both are OFD locks on the `store` file, so a process that dies
//! inside a `bpf()` call leaves no lock behind. Dropping a reference needs no lock: it
//! can only make an object collectable, and the collection that follows the close sees
//! it.

use crate::layout::ObjectKind;
use crate::store::Store;
use crate::{Error, Result};
use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};

fn lock_request(kind: i32) -> libc::flock {
    // SAFETY: flock is plain old data; zero is a valid value of every field.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 0;
    fl.l_len = 1;
    fl
}

/// Makes the open file description behind `fd`, an object's file, a reference to
/// the object, for as long as any descriptor shares the description.
pub fn hold(fd: RawFd) -> std::io::Result<()> {
    let fl = lock_request(libc::F_RDLCK);
    // SAFETY: `fl` is a valid flock for the duration of the call.
    if unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &fl) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether any open file description holds the object file `f`.
fn is_held(f: &File) -> Option<bool> {
    let mut fl = lock_request(libc::F_WRLCK);
    // SAFETY: `fl` is a valid flock, written by the kernel.
    if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) } != 0 {
        // Cannot tell: keep the object.
        return Some(true);
    }
    Some(fl.l_type != libc::F_UNLCK as libc::c_short)
}

/// The store lock, shared or exclusive, released on drop.
pub struct StoreLock {
    _file: File,
}

impl Store {
    fn lock(&self, kind: i32) -> Result<StoreLock> {
        let path = self.handle().shown("store");
        let file = self
            .handle()
            .open("store", libc::O_RDWR)
            .map_err(|e| Error::io("open", &path, e))?;
        let fl = lock_request(kind);
        loop {
            // SAFETY: `fl` is a valid flock for the duration of the call.
            if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLKW, &fl) } == 0 {
                return Ok(StoreLock { _file: file });
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(Error::io("lock", &path, e));
            }
        }
    }

    /// Holds off collection while the caller makes references (see the module doc).
    /// Never collect garbage in a thread that holds this.
    pub fn hold_refs(&self) -> Result<StoreLock> {
        self.lock(libc::F_RDLCK)
    }

    /// Holds off every other reference maker while the caller collects (see the module
    /// doc): `bpftime-maps`' `collect_garbage`, which needs the maps' contents.
    pub fn hold_for_collection(&self) -> Result<StoreLock> {
        self.lock(libc::F_WRLCK)
    }

    /// Whether some open file description holds object `kind`/`id` (`None` when its file
    /// is gone).
    pub fn is_referenced_by_a_descriptor(&self, kind: ObjectKind, id: u32) -> Option<bool> {
        crate::store::open_object_in(self.handle(), kind, id)
            .ok()
            .and_then(|(f, _)| is_held(&f))
    }

    /// Unlinks temporary files left by processes that died while creating an object.
    pub fn remove_stale_temporaries(&self) {
        for name in self.entries() {
            if let Some(rest) = name.strip_prefix(".tmp-") {
                let pid = rest.rsplit('-').next().and_then(|p| p.parse().ok());
                if pid.is_some_and(|p| !crate::owner_alive(p, 0)) {
                    let _ = self.handle().unlink(&name);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;

    /// The property collection rests on: a description's lock is seen from any other
    /// description, in this process too, and survives other descriptions' closes.
    #[test]
    fn a_held_description_is_seen_until_it_closes() {
        let dir = std::env::temp_dir().join(format!("bpftime-hold-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("obj");
        std::fs::write(&path, b"x").unwrap();
        let open = || {
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap()
        };
        let held = || is_held(&File::open(&path).unwrap());
        let holder = open();
        assert_eq!(held(), Some(false));
        hold(holder.as_raw_fd()).unwrap();
        for _ in 0..100 {
            let other = open();
            hold(other.as_raw_fd()).unwrap();
            drop(other);
            assert_eq!(held(), Some(true));
        }
        drop(holder);
        // Other tests of this process fork: a child forked while `holder` was open holds a
        // copy of its description (as the kernel counts it) until the child exits.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while held() == Some(true) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(held(), Some(false));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
