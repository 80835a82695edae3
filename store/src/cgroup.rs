//! Cgroups as the kernel names them to BPF: a cgroup array holds cgroup directories
//! (opened by the tool on the cgroup filesystem) as their ids, the directory's inode
//! number, and `bpf_current_task_under_cgroup` asks whether the calling thread is in
//! one of them or below it.
//!
//! The thread's cgroup comes from `/proc/thread-self/cgroup` (the unified hierarchy's
//! `0::PATH` line) and is found under the cgroup2 mount of `/proc/self/mountinfo`; an
//! ancestor matches by walking up the path. Only the low 32 bits of an id are kept (a
//! cgroup array's value is 4 bytes), as cgroup ids of one machine's cgroups are.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// `statfs` magic numbers of the cgroup filesystems (v2 and v1).
pub const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
const CGROUP_SUPER_MAGIC: i64 = 0x0027_e0eb;

/// The id a cgroup array stores for the cgroup directory open at `fd`, or the errno
/// the kernel gives for an fd that is not one (EBADF).
pub fn id_of_fd(fd: i32) -> Result<u32, i32> {
    // SAFETY: plain out-structs for fstatfs and fstat.
    let (mut fs, mut st): (libc::statfs, libc::stat) = unsafe { std::mem::zeroed() };
    // SAFETY: as above; an invalid fd is an error return.
    let ok = unsafe { libc::fstatfs(fd, &mut fs) == 0 && libc::fstat(fd, &mut st) == 0 };
    // f_type is an i64 on x86-64 and narrower on some other architectures.
    #[allow(clippy::unnecessary_cast)]
    let magic = fs.f_type as i64;
    if !ok
        || !(magic == CGROUP2_SUPER_MAGIC || magic == CGROUP_SUPER_MAGIC)
        || st.st_mode & libc::S_IFMT != libc::S_IFDIR
    {
        return Err(libc::EBADF);
    }
    Ok(st.st_ino as u32)
}

/// Where the unified (v2) hierarchy is mounted, read once: mounts do not move under a
/// running probe, and the helper asking runs on every hit.
pub fn cgroup2_root() -> Option<&'static Path> {
    static ROOT: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| {
        let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        info.lines().find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            (right.split_whitespace().next() == Some("cgroup2"))
                .then(|| left.split_whitespace().nth(4).map(PathBuf::from))
                .flatten()
        })
    })
    .as_deref()
}

/// The calling thread's cgroup in the unified hierarchy, as a directory.
fn current_cgroup_dir() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/thread-self/cgroup").ok()?;
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(cgroup2_root()?.join(path.trim_start_matches('/')))
}

/// Whether the calling thread's cgroup is cgroup `id` or below it.
pub fn current_thread_under(id: u32) -> bool {
    let Some(dir) = current_cgroup_dir() else {
        return false;
    };
    let root = cgroup2_root();
    let mut at: Option<&Path> = Some(&dir);
    while let Some(p) = at {
        if std::fs::metadata(p).is_ok_and(|m| m.ino() as u32 == id) {
            return true;
        }
        if root == Some(p) {
            break;
        }
        at = p.parent();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn the_thread_is_under_its_own_cgroup_and_the_root_only() {
        let (Some(dir), Some(root)) = (current_cgroup_dir(), cgroup2_root()) else {
            eprintln!("no cgroup2 hierarchy here: nothing to check");
            return;
        };
        let id = |p: &Path| {
            let f = std::fs::File::open(p).unwrap();
            id_of_fd(f.as_raw_fd()).unwrap()
        };
        assert!(current_thread_under(id(&dir)));
        assert!(current_thread_under(id(root)));
        // A cgroup beside ours (or none): not an ancestor.
        let sibling = std::fs::read_dir(root)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .find(|p| p.is_dir() && !dir.starts_with(p));
        if let Some(s) = sibling {
            assert!(!current_thread_under(id(&s)), "{}", s.display());
        }
    }

    #[test]
    fn files_that_are_not_cgroups_are_ebadf() {
        let f = std::fs::File::open("/proc/self/status").unwrap();
        assert_eq!(id_of_fd(f.as_raw_fd()), Err(libc::EBADF));
        let d = std::fs::File::open("/tmp").unwrap();
        assert_eq!(id_of_fd(d.as_raw_fd()), Err(libc::EBADF));
        assert_eq!(id_of_fd(-1), Err(libc::EBADF));
    }
}
