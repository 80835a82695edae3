//! bpffs pins, kept in the store.
//!
//! Tools pin at `/sys/fs/bpf/...`, a path in the kernel's BPF filesystem. Objects of a
//! store are not the kernel's, so the kernel's bpffs cannot hold them: each store has
//! its own tree, `pins/`, that stands for `/sys/fs/bpf`. The pin `/sys/fs/bpf/a/b` is
//! the file `pins/a/b`, whose text names the object (`map 12`); directories made under
//! `/sys/fs/bpf` are directories there. A pin is a reference (see `lifetime.rs`), so a
//! pinned object outlives every process, and two tools in one store see the same pins,
//! as two tools on one kernel do. Only paths below `/sys/fs/bpf` are bpffs here; a
//! path elsewhere is, for the kernel, a path outside any bpffs mount.

use crate::layout::ObjectKind;
use crate::store::Store;
use crate::{Error, Result};
use std::path::{Component, Path, PathBuf};

/// Where tools mount bpffs, and the only bpffs the shim serves.
pub const BPFFS_ROOT: &str = "/sys/fs/bpf";
/// The pin tree's directory in a store.
pub(crate) const PINS_DIR: &str = "pins";

/// A pinned object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    /// The path a tool uses, `/sys/fs/bpf/...`.
    pub path: PathBuf,
    pub kind: ObjectKind,
    pub id: u32,
}

/// The part of `path` below `/sys/fs/bpf` (empty for the root itself), or None when
/// the path is outside it. A relative path is taken from the current directory, and
/// `.` and `..` are resolved by name, as the tool wrote them.
pub fn bpffs_relative(path: &Path) -> Option<PathBuf> {
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().ok()?.join(path)
    };
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for c in absolute.components() {
        match c {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                parts.pop();
            }
            Component::Normal(n) => parts.push(n),
        }
    }
    let root = ["sys", "fs", "bpf"];
    if parts.len() < root.len() || parts.iter().zip(root).any(|(p, r)| *p != r) {
        return None;
    }
    Some(parts[root.len()..].iter().collect())
}

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

fn fail(errno: i32, what: String) -> Error {
    Error::invalid(errno, what)
}

impl Store {
    fn pins_dir(&self) -> PathBuf {
        self.dir().join(PINS_DIR)
    }

    /// Where the bpffs path `rel` (from [`bpffs_relative`]) lives in this store.
    pub fn bpffs_path(&self, rel: &Path) -> PathBuf {
        self.pins_dir().join(rel)
    }

    /// Pins an object at `rel`: EEXIST when something is there, ENOENT when the
    /// directory it goes in does not exist, as bpffs answers.
    pub fn pin(&self, rel: &Path, kind: ObjectKind, id: u32) -> Result<()> {
        let target = self.bpffs_path(rel);
        if rel.as_os_str().is_empty() {
            return Err(fail(libc::EEXIST, format!("{BPFFS_ROOT} is a directory")));
        }
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let tmp = self.dir().join(format!(
            ".tmp-pin-{}-{}",
            SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            std::process::id()
        ));
        std::fs::write(&tmp, format!("{} {id}\n", kind.prefix()))
            .map_err(|e| Error::io("create", &tmp, e))?;
        // link() never replaces what is there: two tools pinning at one path race safely.
        let linked = std::fs::hard_link(&tmp, &target);
        let _ = std::fs::remove_file(&tmp);
        linked.map_err(|e| {
            fail(
                errno(&e),
                format!(
                    "cannot pin at {}: {e}",
                    Path::new(BPFFS_ROOT).join(rel).display()
                ),
            )
        })
    }

    /// The object pinned at `rel`: ENOENT when nothing is, EACCES for a directory
    /// (bpffs refuses to open a directory as an object).
    pub fn pinned_object(&self, rel: &Path) -> Result<(ObjectKind, u32)> {
        let path = self.bpffs_path(rel);
        let shown = Path::new(BPFFS_ROOT).join(rel);
        let meta = std::fs::metadata(&path)
            .map_err(|e| fail(errno(&e), format!("no pin at {}: {e}", shown.display())))?;
        if meta.is_dir() {
            return Err(fail(
                libc::EACCES,
                format!("{} is a directory", shown.display()),
            ));
        }
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io("read", &path, e))?;
        parse_pin(&text).ok_or_else(|| {
            fail(
                libc::EINVAL,
                format!("{}: not a pin (`{}`)", path.display(), text.trim()),
            )
        })
    }

    /// Removes the pin at `rel`, as `unlink()` on bpffs does.
    pub fn unpin(&self, rel: &Path) -> Result<()> {
        let path = self.bpffs_path(rel);
        std::fs::remove_file(&path).map_err(|e| {
            fail(
                errno(&e),
                format!(
                    "cannot unpin {}: {e}",
                    Path::new(BPFFS_ROOT).join(rel).display()
                ),
            )
        })
    }

    /// `mkdir()` in bpffs.
    pub fn bpffs_mkdir(&self, rel: &Path) -> Result<()> {
        let path = self.bpffs_path(rel);
        std::fs::create_dir(&path).map_err(|e| Error::io("mkdir", &path, e))
    }

    /// `rmdir()` in bpffs.
    pub fn bpffs_rmdir(&self, rel: &Path) -> Result<()> {
        if rel.as_os_str().is_empty() {
            return Err(fail(libc::EBUSY, format!("{BPFFS_ROOT} is a mount point")));
        }
        let path = self.bpffs_path(rel);
        std::fs::remove_dir(&path).map_err(|e| Error::io("rmdir", &path, e))
    }

    /// Every pin in the store.
    pub fn pins(&self) -> Vec<Pin> {
        let mut out = Vec::new();
        let mut dirs = vec![PathBuf::new()];
        while let Some(rel) = dirs.pop() {
            let Ok(entries) = std::fs::read_dir(self.bpffs_path(&rel)) else {
                continue;
            };
            for e in entries.flatten() {
                let r = rel.join(e.file_name());
                match e.file_type() {
                    Ok(t) if t.is_dir() => dirs.push(r),
                    Ok(_) => {
                        if let Some((kind, id)) = std::fs::read_to_string(e.path())
                            .ok()
                            .and_then(|t| parse_pin(&t))
                        {
                            out.push(Pin {
                                path: Path::new(BPFFS_ROOT).join(r),
                                kind,
                                id,
                            });
                        }
                    }
                    Err(_) => {}
                }
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out
    }

    pub(crate) fn is_pinned(&self, kind: ObjectKind, id: u32) -> bool {
        self.pins().iter().any(|p| p.kind == kind && p.id == id)
    }
}

fn parse_pin(text: &str) -> Option<(ObjectKind, u32)> {
    let (k, id) = text.trim().split_once(' ')?;
    let kind = ObjectKind::ALL.into_iter().find(|o| o.prefix() == k)?;
    Some((kind, id.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_below_sys_fs_bpf_are_bpffs() {
        let rel = |p: &str| bpffs_relative(Path::new(p));
        assert_eq!(rel("/sys/fs/bpf"), Some(PathBuf::new()));
        assert_eq!(rel("/sys/fs/bpf/a/b"), Some(PathBuf::from("a/b")));
        assert_eq!(rel("//sys/fs//bpf/./a"), Some(PathBuf::from("a")));
        assert_eq!(rel("/sys/fs/bpf/a/../b"), Some(PathBuf::from("b")));
        assert_eq!(rel("/sys/fs/bpf/../bpfx"), None);
        assert_eq!(rel("/sys/fs/bpfx/a"), None);
        assert_eq!(rel("/tmp/a"), None);
        assert_eq!(rel("/sys/fs"), None);
    }

    #[test]
    fn pin_text_round_trips() {
        assert_eq!(parse_pin("map 12\n"), Some((ObjectKind::Map, 12)));
        assert_eq!(parse_pin("link 3"), Some((ObjectKind::Link, 3)));
        assert_eq!(parse_pin("nonsense"), None);
        assert_eq!(parse_pin("map x"), None);
    }
}
