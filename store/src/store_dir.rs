//! The store directory as an open handle, and every file in it reached relative to it.
//!
//! A store directory belongs to one user: its name carries the user's effective uid, it
//! is made mode 0700, and a directory not owned by the caller or writable by anyone
//! else is refused (another user could put programs in it that the caller's targets
//! run, or links that make the caller, perhaps root, write where they point). The
//! check is made on the handle (`fstat`), and every file is then opened, created,
//! linked, renamed or removed relative to that handle, never following a symbolic
//! link: what was checked is what is used, even if the path is swapped afterwards.

use crate::{Error, Result};
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An open, checked directory of a store (the store itself or a directory of its pin
/// tree), shared by everything that opens files in it.
#[derive(Clone)]
pub struct StoreDir {
    fd: Arc<OwnedFd>,
    /// For messages only: nothing is opened by this path.
    path: Arc<PathBuf>,
}

fn cname(name: &OsStr) -> io::Result<CString> {
    if name.is_empty() || name.as_bytes().contains(&b'/') {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// The caller's effective uid, which owns its stores.
pub fn euid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() }
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain old data, filled in by the kernel.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open; `st` is a valid out buffer.
    cvt(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st)
}

fn untrusted(dir: &Path, why: String) -> Error {
    Error::Untrusted {
        dir: dir.to_path_buf(),
        why,
    }
}

/// Refuses a directory the caller does not own alone.
fn check_owned(st: &libc::stat, dir: &Path) -> Result<()> {
    let me = euid();
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(untrusted(dir, "it is not a directory".into()));
    }
    if st.st_uid != me {
        return Err(untrusted(
            dir,
            format!(
                "it is owned by uid {} (mode {:04o}), not by you (uid {me})",
                st.st_uid,
                st.st_mode & 0o7777
            ),
        ));
    }
    if st.st_mode & 0o022 != 0 {
        return Err(untrusted(
            dir,
            format!(
                "its mode {:04o} lets other users add or replace files in it",
                st.st_mode & 0o7777
            ),
        ));
    }
    Ok(())
}

impl StoreDir {
    /// Opens the directory `name` in `parent`, without following a link, and checks that
    /// the caller alone owns it. With `create`, makes it first (mode 0700, whatever the
    /// umask) when it is not there. `Ok(None)` when it does not exist and `create` is off.
    fn open_checked(
        parent: RawFd,
        name: &OsStr,
        path: PathBuf,
        create: bool,
    ) -> Result<Option<StoreDir>> {
        let c = cname(name).map_err(|e| Error::io("open", &path, e))?;
        let mut created = false;
        if create {
            // SAFETY: `c` is a NUL-terminated name; `parent` is open.
            match cvt(unsafe { libc::mkdirat(parent, c.as_ptr(), 0o700) }) {
                Ok(_) => created = true,
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                Err(e) => return Err(Error::io("create directory", &path, e)),
            }
        }
        // SAFETY: as above.
        let fd = unsafe {
            libc::openat(
                parent,
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOENT) if !create => Ok(None),
                Some(libc::ELOOP) | Some(libc::ENOTDIR) => match lstat_at(parent, &c) {
                    Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => Err(untrusted(
                        &path,
                        "it is a symbolic link, not a directory".into(),
                    )),
                    _ => Err(Error::io("open", &path, e)),
                },
                _ => Err(Error::io("open", &path, e)),
            };
        }
        // SAFETY: a descriptor just opened and owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut st = fstat(fd.as_raw_fd()).map_err(|e| Error::io("stat", &path, e))?;
        if created && st.st_uid == euid() && st.st_mode & 0o7777 != 0o700 {
            // SAFETY: `fd` is open.
            cvt(unsafe { libc::fchmod(fd.as_raw_fd(), 0o700) })
                .map_err(|e| Error::io("chmod", &path, e))?;
            st.st_mode = (st.st_mode & !0o7777) | 0o700;
        }
        check_owned(&st, &path)?;
        Ok(Some(StoreDir {
            fd: Arc::new(fd),
            path: Arc::new(path),
        }))
    }

    /// Opens (and with `create`, makes) the store directory `name` in `root`.
    pub fn open_store(root: &Path, name: &str, create: bool) -> Result<Option<StoreDir>> {
        let path = root.join(name);
        let c = CString::new(root.as_os_str().as_bytes())
            .map_err(|_| Error::invalid(libc::EINVAL, "the store root holds a NUL byte"))?;
        // The root (`/dev/shm` or BPFTIME_SHM_ROOT) is the administrator's choice, so it
        // may be reached through links; the store directory in it may not.
        // SAFETY: `c` is NUL-terminated.
        let root_fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if root_fd < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENOENT) && !create {
                return Ok(None);
            }
            return Err(Error::io("open", root, e));
        }
        // SAFETY: just opened, owned by nothing else.
        let root_fd = unsafe { OwnedFd::from_raw_fd(root_fd) };
        Self::open_checked(root_fd.as_raw_fd(), OsStr::new(name), path, create)
    }

    /// Opens (and with `create`, makes) the subdirectory `name`, checked as the store is.
    pub fn subdir(&self, name: &OsStr, create: bool) -> Result<Option<StoreDir>> {
        Self::open_checked(self.raw(), name, self.path.join(name), create)
    }

    fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The directory's path, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of `name` in the directory, for messages.
    pub fn shown(&self, name: impl AsRef<OsStr>) -> PathBuf {
        self.path.join(name.as_ref())
    }

    /// Opens `name` with `flags` (`O_RDWR`, `O_APPEND`, `O_CREAT`...), never following a
    /// link; a file it creates is 0600.
    pub fn open(&self, name: impl AsRef<OsStr>, flags: libc::c_int) -> io::Result<File> {
        let c = cname(name.as_ref())?;
        // SAFETY: `c` is NUL-terminated; the mode is read only with O_CREAT.
        let fd = cvt(unsafe {
            libc::openat(
                self.raw(),
                c.as_ptr(),
                flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        })?;
        // SAFETY: just opened, owned by nothing else.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// Creates `name`, read-write, mode 0600; fails if anything (a link too) is there.
    pub fn create_new(&self, name: impl AsRef<OsStr>) -> io::Result<File> {
        let f = self.open(name, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL)?;
        // The umask may have taken bits off 0600, never added any; this makes it exact.
        // SAFETY: `f` is open.
        cvt(unsafe { libc::fchmod(f.as_raw_fd(), 0o600) })?;
        Ok(f)
    }

    /// Creates a temporary `name`: one left by a process that had this pid is removed.
    pub fn create_temporary(&self, name: impl AsRef<OsStr>) -> io::Result<File> {
        let name = name.as_ref();
        match self.create_new(name) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                self.unlink(name)?;
                self.create_new(name)
            }
            r => r,
        }
    }

    /// Links `from` as `to`; fails with EEXIST when `to` is there (a link too).
    pub fn link(&self, from: impl AsRef<OsStr>, to: impl AsRef<OsStr>) -> io::Result<()> {
        self.link_to(from, self, to)
    }

    /// Links `from` as `to` in the directory `dest` (of the same store).
    pub fn link_to(
        &self,
        from: impl AsRef<OsStr>,
        dest: &StoreDir,
        to: impl AsRef<OsStr>,
    ) -> io::Result<()> {
        let (a, b) = (cname(from.as_ref())?, cname(to.as_ref())?);
        // SAFETY: NUL-terminated names; flags 0: a link `from` is linked itself, not followed.
        cvt(unsafe { libc::linkat(self.raw(), a.as_ptr(), dest.raw(), b.as_ptr(), 0) })?;
        Ok(())
    }

    /// Renames `from` to `to`, replacing what `to` names (a link itself, not its target).
    pub fn rename(&self, from: impl AsRef<OsStr>, to: impl AsRef<OsStr>) -> io::Result<()> {
        let (a, b) = (cname(from.as_ref())?, cname(to.as_ref())?);
        // SAFETY: NUL-terminated names.
        cvt(unsafe { libc::renameat(self.raw(), a.as_ptr(), self.raw(), b.as_ptr()) })?;
        Ok(())
    }

    /// Removes the entry `name` (a link itself, not its target).
    pub fn unlink(&self, name: impl AsRef<OsStr>) -> io::Result<()> {
        let c = cname(name.as_ref())?;
        // SAFETY: NUL-terminated name.
        cvt(unsafe { libc::unlinkat(self.raw(), c.as_ptr(), 0) })?;
        Ok(())
    }

    /// Removes the empty directory `name`.
    pub fn rmdir(&self, name: impl AsRef<OsStr>) -> io::Result<()> {
        let c = cname(name.as_ref())?;
        // SAFETY: NUL-terminated name.
        cvt(unsafe { libc::unlinkat(self.raw(), c.as_ptr(), libc::AT_REMOVEDIR) })?;
        Ok(())
    }

    /// Makes the directory `name`, 0700.
    pub fn mkdir(&self, name: impl AsRef<OsStr>) -> io::Result<()> {
        let c = cname(name.as_ref())?;
        // SAFETY: NUL-terminated name.
        cvt(unsafe { libc::mkdirat(self.raw(), c.as_ptr(), 0o700) })?;
        Ok(())
    }

    /// Makes the FIFO `name`, 0600; one already there is kept.
    pub fn mkfifo(&self, name: impl AsRef<OsStr>) -> io::Result<()> {
        let c = cname(name.as_ref())?;
        // SAFETY: NUL-terminated name.
        match cvt(unsafe { libc::mkfifoat(self.raw(), c.as_ptr(), 0o600) }) {
            Err(e) if e.raw_os_error() != Some(libc::EEXIST) => Err(e),
            _ => Ok(()),
        }
    }

    /// What `name` is, not following a link.
    pub fn stat(&self, name: impl AsRef<OsStr>) -> io::Result<libc::stat> {
        lstat_at(self.raw(), &cname(name.as_ref())?)
    }

    /// Whether `name` exists (as anything, a link too).
    pub fn exists(&self, name: impl AsRef<OsStr>) -> bool {
        self.stat(name).is_ok()
    }

    /// The names in the directory, without `.` and `..`.
    pub fn entries(&self) -> io::Result<Vec<OsString>> {
        // A descriptor of its own: readdir moves the position of the one it reads.
        // SAFETY: "." names the directory itself.
        let fd = cvt(unsafe {
            libc::openat(
                self.raw(),
                c".".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: `fd` is an open directory; on success the stream owns it.
        let dir = unsafe { libc::fdopendir(fd) };
        if dir.is_null() {
            let e = io::Error::last_os_error();
            // SAFETY: `fd` is still ours when fdopendir failed.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        let mut out = Vec::new();
        loop {
            // SAFETY: `dir` is an open stream used by this thread only.
            let ent = unsafe { libc::readdir(dir) };
            if ent.is_null() {
                break;
            }
            // SAFETY: readdir returns an entry whose name is NUL-terminated.
            let name = unsafe { std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()) }.to_bytes();
            if name != b"." && name != b".." {
                out.push(OsString::from_vec(name.to_vec()));
            }
        }
        // SAFETY: closes the stream (and `fd`) opened above.
        unsafe { libc::closedir(dir) };
        Ok(out)
    }

    /// Watches the directory with the inotify instance `inotify`.
    pub fn watch(&self, inotify: RawFd, mask: u32) -> io::Result<i32> {
        // inotify_add_watch takes only a path. This one is the descriptor's own link in
        // /proc, which names the very directory that was checked, whatever was done to
        // its path since; watching opens and changes nothing in it.
        let c = CString::new(format!("/proc/self/fd/{}", self.raw()))
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: NUL-terminated path; `inotify` is the caller's instance.
        cvt(unsafe { libc::inotify_add_watch(inotify, c.as_ptr(), mask) })
    }
}

fn lstat_at(dir: RawFd, name: &CString) -> io::Result<libc::stat> {
    // SAFETY: stat is plain old data, filled in by the kernel.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: NUL-terminated name, valid out buffer.
    cvt(unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(st)
}
