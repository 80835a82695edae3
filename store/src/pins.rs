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
use crate::store::{Store, PINS_DIR};
use crate::store_dir::StoreDir;
use crate::{Error, Result};
use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

/// Where tools mount bpffs, and the only bpffs the shim serves.
pub const BPFFS_ROOT: &str = "/sys/fs/bpf";

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
    /// The pin tree's directory, opened and checked as the store's is.
    fn pins_root(&self) -> Result<StoreDir> {
        self.handle()
            .subdir(OsStr::new(PINS_DIR), false)?
            .ok_or_else(|| {
                fail(
                    libc::ENOENT,
                    format!("{} is missing", self.handle().shown(PINS_DIR).display()),
                )
            })
    }

    /// The directory that holds `rel` (each step opened without following links) and
    /// `rel`'s last name; None for the root itself.
    fn pin_parent(&self, rel: &Path) -> Result<Option<(StoreDir, OsString)>> {
        let mut names: Vec<&OsStr> = rel
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n),
                _ => None,
            })
            .collect();
        let Some(last) = names.pop() else {
            return Ok(None);
        };
        let mut dir = self.pins_root()?;
        for n in names {
            dir = dir.subdir(n, false)?.ok_or_else(|| {
                fail(
                    libc::ENOENT,
                    format!(
                        "{} does not exist",
                        Path::new(BPFFS_ROOT).join(rel).display()
                    ),
                )
            })?;
        }
        Ok(Some((dir, last.to_os_string())))
    }

    /// Where the bpffs path `rel` (from [`bpffs_relative`]) lives in this store, for
    /// `statfs`, which reads no file; files there are reached through the store's handle.
    pub fn bpffs_path(&self, rel: &Path) -> PathBuf {
        self.dir().join(PINS_DIR).join(rel)
    }

    /// Whether something (a pin or a directory) is at the bpffs path `rel`.
    pub fn bpffs_exists(&self, rel: &Path) -> bool {
        match self.pin_parent(rel) {
            Ok(None) => true,
            Ok(Some((dir, name))) => dir.exists(&name),
            Err(_) => false,
        }
    }

    /// Pins an object at `rel`: EEXIST when something is there, ENOENT when the
    /// directory it goes in does not exist, as bpffs answers.
    pub fn pin(&self, rel: &Path, kind: ObjectKind, id: u32) -> Result<()> {
        let shown = Path::new(BPFFS_ROOT).join(rel);
        let Some((dir, name)) = self.pin_parent(rel)? else {
            return Err(fail(libc::EEXIST, format!("{BPFFS_ROOT} is a directory")));
        };
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let tmp = format!(
            ".tmp-pin-{}-{}",
            SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            std::process::id()
        );
        // The temporary is made in the store directory itself, where collection finds
        // one left by a process that died, and linked into the pin's directory.
        let store = self.handle();
        store
            .create_temporary(&tmp)
            .and_then(|mut f| f.write_all(format!("{} {id}\n", kind.prefix()).as_bytes()))
            .map_err(|e| Error::io("create", store.shown(&tmp), e))?;
        // link() never replaces what is there: two tools pinning at one path race safely.
        let linked = store.link_to(&tmp, &dir, &name);
        let _ = store.unlink(&tmp);
        linked.map_err(|e| fail(errno(&e), format!("cannot pin at {}: {e}", shown.display())))
    }

    /// The object pinned at `rel`: ENOENT when nothing is, EACCES for a directory
    /// (bpffs refuses to open a directory as an object).
    pub fn pinned_object(&self, rel: &Path) -> Result<(ObjectKind, u32)> {
        let shown = Path::new(BPFFS_ROOT).join(rel);
        let Some((dir, name)) = self.pin_parent(rel)? else {
            return Err(fail(
                libc::EACCES,
                format!("{} is a directory", shown.display()),
            ));
        };
        let st = dir
            .stat(&name)
            .map_err(|e| fail(errno(&e), format!("no pin at {}: {e}", shown.display())))?;
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            return Err(fail(
                libc::EACCES,
                format!("{} is a directory", shown.display()),
            ));
        }
        let text = read_pin(&dir, &name).map_err(|e| Error::io("read", dir.shown(&name), e))?;
        parse_pin(&text).ok_or_else(|| {
            fail(
                libc::EINVAL,
                format!(
                    "{}: not a pin (`{}`)",
                    dir.shown(&name).display(),
                    text.trim()
                ),
            )
        })
    }

    /// Removes the pin at `rel`, as `unlink()` on bpffs does.
    pub fn unpin(&self, rel: &Path) -> Result<()> {
        let shown = Path::new(BPFFS_ROOT).join(rel);
        let Some((dir, name)) = self.pin_parent(rel)? else {
            return Err(fail(libc::EISDIR, format!("{BPFFS_ROOT} is a directory")));
        };
        dir.unlink(&name)
            .map_err(|e| fail(errno(&e), format!("cannot unpin {}: {e}", shown.display())))
    }

    /// `mkdir()` in bpffs.
    pub fn bpffs_mkdir(&self, rel: &Path) -> Result<()> {
        let Some((dir, name)) = self.pin_parent(rel)? else {
            return Err(fail(libc::EEXIST, format!("{BPFFS_ROOT} exists")));
        };
        dir.mkdir(&name)
            .map_err(|e| Error::io("mkdir", dir.shown(&name), e))
    }

    /// `rmdir()` in bpffs.
    pub fn bpffs_rmdir(&self, rel: &Path) -> Result<()> {
        let Some((dir, name)) = self.pin_parent(rel)? else {
            return Err(fail(libc::EBUSY, format!("{BPFFS_ROOT} is a mount point")));
        };
        dir.rmdir(&name)
            .map_err(|e| Error::io("rmdir", dir.shown(&name), e))
    }

    /// Every pin in the store.
    pub fn pins(&self) -> Vec<Pin> {
        let mut out = Vec::new();
        let Ok(root) = self.pins_root() else {
            return out;
        };
        let mut dirs = vec![(PathBuf::new(), root)];
        while let Some((rel, dir)) = dirs.pop() {
            for name in dir.entries().unwrap_or_default() {
                let r = rel.join(&name);
                let Ok(st) = dir.stat(&name) else { continue };
                match st.st_mode & libc::S_IFMT {
                    libc::S_IFDIR => {
                        if let Ok(Some(sub)) = dir.subdir(&name, false) {
                            dirs.push((r, sub));
                        }
                    }
                    libc::S_IFREG => {
                        if let Some((kind, id)) =
                            read_pin(&dir, &name).ok().and_then(|t| parse_pin(&t))
                        {
                            out.push(Pin {
                                path: Path::new(BPFFS_ROOT).join(r),
                                kind,
                                id,
                            });
                        }
                    }
                    _ => {}
                }
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out
    }

    pub fn is_pinned(&self, kind: ObjectKind, id: u32) -> bool {
        self.pins().iter().any(|p| p.kind == kind && p.id == id)
    }
}

/// A pin file's text (a few bytes: more is not a pin).
fn read_pin(dir: &StoreDir, name: &OsStr) -> std::io::Result<String> {
    let f = dir.open(name, libc::O_RDONLY | libc::O_NONBLOCK)?;
    let mut text = String::new();
    f.take(64).read_to_string(&mut text)?;
    Ok(text)
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
