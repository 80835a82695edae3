use crate::cpu::possible_cpus;
use crate::layout::{
    CpuSlotsHeader, ObjectHeader, ObjectKind, StoreHeader, CPU_SLOTS_MAGIC, CPU_SLOT_STRIDE,
    OBJECT_MAGIC, STORE_VERSION,
};
use crate::mapping::Mapping;
use crate::store_dir::StoreDir;
use crate::{Error, Result};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

/// The store a process uses when nothing names another one.
pub const DEFAULT_STORE_NAME: &str = "default";
pub use bpftime_abi::STORE_ENV;
use bpftime_abi::STORE_ROOT_ENV;

/// A handle on one store directory.
pub struct Store {
    name: String,
    /// The checked directory every file of the store is reached through.
    dir: StoreDir,
    header: Mapping,
}

/// What `bpftime list` shows about an object file.
#[derive(Debug, Clone)]
pub struct ObjectInfo {
    pub kind: ObjectKind,
    pub id: u32,
    pub owner_pid: u32,
    pub owner_alive: bool,
    pub pinned: bool,
    pub path: PathBuf,
}

fn store_root() -> PathBuf {
    std::env::var_os(STORE_ROOT_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/dev/shm"))
}

/// True while the process `pid` that started at `start` (clock ticks since boot,
/// 0 = unknown) is running: a pid reused by another process does not count.
pub fn owner_alive(pid: u32, start: u64) -> bool {
    if pid == 0 {
        return false;
    }
    match process_start_time(pid) {
        Some(t) => start == 0 || t == start,
        None => false,
    }
}

pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses; fields resume after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    // Field 22 of stat is starttime; `rest` begins at field 3.
    let state = rest.split_whitespace().next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    rest.split_whitespace().nth(19)?.parse().ok()
}

pub fn self_start_time() -> u64 {
    process_start_time(std::process::id()).unwrap_or(0)
}

impl Store {
    /// The directory that holds the store `name` of the calling user (its effective
    /// uid): every user has their own stores, the default one too.
    pub fn dir_for(name: &str) -> PathBuf {
        store_root().join(dir_name(name))
    }

    /// The store named by `BPFTIME_STORE`, or the default one.
    pub fn name_from_env() -> String {
        std::env::var(STORE_ENV)
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| DEFAULT_STORE_NAME.to_string())
    }

    fn check_name(name: &str) -> Result<()> {
        if name.is_empty()
            || name.len() > 64
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
            || name == "."
            || name == ".."
        {
            return Err(Error::invalid(
                libc::EINVAL,
                format!("store name `{name}` must be 1-64 letters, digits, '-', '_' or '.'"),
            ));
        }
        Ok(())
    }

    /// Opens the store, creating it if needed.
    pub fn create_or_open(name: &str) -> Result<Store> {
        Self::check_name(name)?;
        let Some(dir) = StoreDir::open_store(&store_root(), &dir_name(name), true)? else {
            return Err(Error::NoStore {
                name: name.to_string(),
                dir: Self::dir_for(name),
            });
        };
        if !dir.exists("store") {
            let tmp = format!(".tmp-store-{}", std::process::id());
            let mut bytes = vec![0u8; std::mem::size_of::<StoreHeader>()];
            bytes[0..4].copy_from_slice(&OBJECT_MAGIC.to_ne_bytes());
            bytes[4..8].copy_from_slice(&STORE_VERSION.to_ne_bytes());
            bytes[8..12].copy_from_slice(&1u32.to_ne_bytes());
            let written = dir
                .create_temporary(&tmp)
                .and_then(|mut f| f.write_all(&bytes))
                .map_err(|e| Error::io("create", dir.shown(&tmp), e));
            // link() refuses to replace, so two processes racing to create agree on one header.
            let linked = written.and_then(|()| {
                dir.link(&tmp, "store")
                    .map_err(|e| Error::io("create", dir.shown("store"), e))
            });
            let _ = dir.unlink(&tmp);
            match linked {
                Ok(()) => {}
                Err(e) if e.errno() == libc::EEXIST => {}
                Err(e) => return Err(e),
            }
        }
        create_cpu_table(&dir)?;
        dir.subdir(std::ffi::OsStr::new(PINS_DIR), true)?;
        Self::open_dir(name, dir)
    }

    /// Opens an existing store.
    pub fn open(name: &str) -> Result<Store> {
        Self::check_name(name)?;
        let no_store = || Error::NoStore {
            name: name.to_string(),
            dir: Self::dir_for(name),
        };
        let dir =
            StoreDir::open_store(&store_root(), &dir_name(name), false)?.ok_or_else(no_store)?;
        if !dir.exists("store") {
            return Err(no_store());
        }
        Self::open_dir(name, dir)
    }

    fn open_dir(name: &str, dir: StoreDir) -> Result<Store> {
        let path = dir.shown("store");
        let file = dir
            .open("store", libc::O_RDWR)
            .map_err(|e| Error::io("open", &path, e))?;
        let len = std::mem::size_of::<StoreHeader>();
        // A mapping past the end of the file faults at the first read (SIGBUS).
        let have = file
            .metadata()
            .map_err(|e| Error::io("stat", &path, e))?
            .len();
        if have < len as u64 {
            return Err(Error::invalid(
                libc::EINVAL,
                format!(
                    "{} is {have} bytes, shorter than a store header ({len}): the store is damaged; remove {} once no bpftime process uses it, or use another `--store` name",
                    path.display(),
                    Self::dir_for(name).display()
                ),
            ));
        }
        let header = Mapping::map_file(&file, len, &path)?;
        let store = Store {
            name: name.to_string(),
            dir,
            header,
        };
        let h = store.header();
        check_magic_and_version(&path, h.magic, OBJECT_MAGIC, h.version)?;
        Ok(store)
    }

    fn header(&self) -> &StoreHeader {
        // SAFETY: the mapping is at least size_of::<StoreHeader>() long and page aligned;
        // the fields other processes change are atomics.
        unsafe { &*(self.header.base() as *const StoreHeader) }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Why the store's header (file `store`) is damaged, if it is: an access faulted,
    /// or its magic or version is no longer this store's. A watcher's slow check.
    pub fn check_damage(&self) -> Option<crate::Damage> {
        let h = self.header();
        if h.magic != OBJECT_MAGIC || h.version != STORE_VERSION {
            self.header.mark_damaged(crate::Damage::Garbage);
        }
        self.header.damage()
    }

    /// The store's directory, for messages: files in it are reached through the
    /// store's own handle on it (the `open_*` methods), never by this path.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn handle(&self) -> &StoreDir {
        &self.dir
    }

    /// A new object id, unique in this store.
    pub fn alloc_id(&self) -> u32 {
        self.header().next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Changes whenever links are added or removed.
    pub fn generation(&self) -> u64 {
        self.header().generation.load(Ordering::Acquire)
    }

    pub fn bump_generation(&self) {
        self.header().generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Where an object's file is, for messages.
    pub fn path(&self, kind: ObjectKind, id: u32) -> PathBuf {
        self.dir.shown(object_name(kind, id))
    }

    /// Opens an object's file read-write (a descriptor for it holds the object).
    pub fn open_object(&self, kind: ObjectKind, id: u32) -> Result<File> {
        open_object_in(&self.dir, kind, id).map(|(f, _)| f)
    }

    /// Opens the file of a perf event's ring, which its consumer maps.
    pub fn open_perf_ring(&self, event_id: u32) -> Result<File> {
        let name = perf_ring_name(event_id);
        self.dir
            .open(&name, libc::O_RDWR)
            .map_err(|e| Error::io("open", self.dir.shown(&name), e))
    }

    /// Where the file of a perf event's ring is, for messages.
    pub fn perf_ring_path(&self, event_id: u32) -> PathBuf {
        self.dir.shown(perf_ring_name(event_id))
    }

    /// Opens a perf event ring's wake-up FIFO, non-blocking.
    pub fn open_perf_fifo(&self, event_id: u32) -> Result<File> {
        open_fifo(&self.dir, &perf_fifo_name(event_id))
    }

    /// Opens the file `bpf_trace_printk` appends to, for reading; None while there is none.
    pub fn open_trace_pipe(&self) -> Result<Option<File>> {
        match self.dir.open(TRACE_PIPE, libc::O_RDONLY) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io("open", self.dir.shown(TRACE_PIPE), e)),
        }
    }

    /// Opens (creating) the file where trace pipe readers keep how far they read.
    pub fn open_trace_position(&self) -> Result<File> {
        let name = "trace_pipe.consumed";
        self.dir
            .open(name, libc::O_RDWR | libc::O_CREAT)
            .map_err(|e| Error::io("open", self.dir.shown(name), e))
    }

    /// The names in the store directory.
    pub fn entries(&self) -> Vec<String> {
        self.dir
            .entries()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|n| n.into_string().ok())
            .collect()
    }

    /// Watches the store directory with the inotify instance `inotify` (see
    /// `inotify_add_watch(2)`); the watch descriptor.
    pub fn watch(&self, inotify: std::os::fd::RawFd, mask: u32) -> std::io::Result<i32> {
        self.dir.watch(inotify, mask)
    }

    /// Publishes a new object: `len` bytes initialised by `init`, then renamed into
    /// place so that readers never see a half-written object.
    pub fn publish_with(
        &self,
        kind: ObjectKind,
        id: u32,
        len: usize,
        init: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<PathBuf> {
        let tmp = format!(".tmp-{}-{id}-{}", kind.prefix(), std::process::id());
        let shown = self.dir.shown(&tmp);
        let result = (|| {
            let file = self
                .dir
                .create_temporary(&tmp)
                .map_err(|e| Error::io("create", &shown, e))?;
            file.set_len(len as u64)
                .map_err(|e| Error::io("resize", &shown, e))?;
            let m = Mapping::map_file(&file, len, &shown)?;
            // SAFETY: the mapping is `len` bytes, private to this process until the rename.
            let bytes = unsafe { std::slice::from_raw_parts_mut(m.base(), m.byte_len()) };
            init(bytes)?;
            let name = object_name(kind, id);
            self.dir
                .rename(&tmp, &name)
                .map_err(|e| Error::io("rename", self.dir.shown(&name), e))?;
            Ok(self.dir.shown(&name))
        })();
        if result.is_err() {
            let _ = self.dir.unlink(&tmp);
        }
        result
    }

    /// Publishes a record object whose bytes are already serialised.
    pub fn publish_bytes(&self, kind: ObjectKind, id: u32, bytes: &[u8]) -> Result<PathBuf> {
        self.publish_with(kind, id, bytes.len(), |b| {
            b.copy_from_slice(bytes);
            Ok(())
        })
    }

    pub fn read_object(&self, kind: ObjectKind, id: u32) -> Result<Vec<u8>> {
        let (mut file, path) = open_object_in(&self.dir, kind, id)?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut file, &mut bytes)
            .map_err(|e| Error::io("read", &path, e))?;
        check_header(&path, &bytes, kind)?;
        Ok(bytes)
    }

    /// Ids of the objects of one kind, in creation order.
    pub fn ids(&self, kind: ObjectKind) -> Vec<u32> {
        let prefix = format!("{}-", kind.prefix());
        let mut ids: Vec<u32> = self
            .dir
            .entries()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|n| {
                n.to_str()
                    .and_then(|n| n.strip_prefix(&prefix))
                    .and_then(|n| n.parse().ok())
            })
            .collect();
        ids.sort_unstable();
        ids
    }

    pub fn info(&self, kind: ObjectKind, id: u32) -> Option<ObjectInfo> {
        let mut buf = [0u8; std::mem::size_of::<ObjectHeader>()];
        let (file, path) = open_object_in(&self.dir, kind, id).ok()?;
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut buf, 0).ok()?;
        // SAFETY: ObjectHeader is plain old data; read_unaligned copes with the buffer's alignment.
        let h: ObjectHeader = unsafe { std::ptr::read_unaligned(buf.as_ptr().cast()) };
        if h.magic != OBJECT_MAGIC {
            return None;
        }
        Some(ObjectInfo {
            kind,
            id,
            owner_pid: h.owner_pid,
            owner_alive: owner_alive(h.owner_pid, h.owner_start),
            pinned: self.is_pinned(kind, id),
            path,
        })
    }

    /// Removes an object. Processes that have it mapped keep their mapping.
    ///
    /// Objects die by [`Store::collect_garbage`] when their last reference goes;
    /// this is for an object that must go at once (a detached link, a map whose
    /// creation failed half way).
    pub fn remove(&self, kind: ObjectKind, id: u32) -> Result<()> {
        let name = object_name(kind, id);
        match self.dir.unlink(&name) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("remove", self.dir.shown(&name), e)),
        }
        if kind == ObjectKind::Map {
            let _ = self.dir.unlink(map_fifo_name(id));
        }
        if kind == ObjectKind::PerfEvent {
            // Its ring's files go with the event.
            let _ = self.dir.unlink(perf_ring_name(id));
            let _ = self.dir.unlink(perf_fifo_name(id));
        }
        if kind == ObjectKind::Link || kind == ObjectKind::PerfEvent {
            self.bump_generation();
        }
        Ok(())
    }

    /// Deletes the whole store directory.
    pub fn destroy(self) -> Result<()> {
        let dir = self.dir.path().to_path_buf();
        drop(self);
        fs::remove_dir_all(&dir).map_err(|e| Error::io("remove", &dir, e))
    }
}

/// The name of the directory of the caller's store `name` in the store root.
fn dir_name(name: &str) -> String {
    format!("bpftime-{}-{name}", crate::store_dir::euid())
}

/// The file `bpf_trace_printk` appends to.
pub const TRACE_PIPE: &str = "trace_pipe";
/// The directory of the store's pins (`pins.rs`).
pub const PINS_DIR: &str = "pins";

pub fn new_object_header(kind: ObjectKind, id: u32) -> ObjectHeader {
    ObjectHeader {
        magic: OBJECT_MAGIC,
        version: STORE_VERSION,
        kind: kind as u32,
        id,
        owner_pid: std::process::id(),
        pinned: Default::default(),
        owner_start: self_start_time(),
    }
}

pub fn check_header(path: &Path, bytes: &[u8], kind: ObjectKind) -> Result<()> {
    if bytes.len() < std::mem::size_of::<ObjectHeader>() {
        return Err(Error::BadMagic {
            path: path.to_path_buf(),
            magic: 0,
        });
    }
    // SAFETY: length checked above; ObjectHeader is plain old data.
    let h: ObjectHeader = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    if h.kind != kind as u32 {
        return Err(Error::BadMagic {
            path: path.to_path_buf(),
            magic: h.magic,
        });
    }
    check_magic_and_version(path, h.magic, OBJECT_MAGIC, h.version)
}

/// Refuses a store file whose header does not start with `want` and this build's
/// [`STORE_VERSION`].
pub fn check_magic_and_version(path: &Path, magic: u32, want: u32, version: u32) -> Result<()> {
    if magic != want {
        return Err(Error::BadMagic {
            path: path.to_path_buf(),
            magic,
        });
    }
    if version != STORE_VERSION {
        return Err(Error::Version {
            path: path.to_path_buf(),
            found: version,
            expected: STORE_VERSION,
        });
    }
    Ok(())
}

pub fn object_name(kind: ObjectKind, id: u32) -> String {
    format!("{}-{id}", kind.prefix())
}

/// The file of a perf event's ring (`bpftime-maps`' `PerfRing`).
pub fn perf_ring_name(event_id: u32) -> String {
    format!("perfring-{event_id}")
}

/// The FIFO a perf event's ring wakes its reader through.
pub fn perf_fifo_name(event_id: u32) -> String {
    format!("fifo-perf-{event_id}")
}

pub fn map_fifo_name(map_id: u32) -> String {
    format!("fifo-{map_id}")
}

/// Opens a wake-up FIFO of the store, non-blocking (read-write, so the open never waits
/// for a peer).
pub fn open_fifo(dir: &StoreDir, name: &str) -> Result<File> {
    dir.open(name, libc::O_RDWR | libc::O_NONBLOCK)
        .map_err(|e| Error::io("open", dir.shown(name), e))
}

/// Opens object `id` of the store in `dir`, for a holder of one of its objects that
/// has no [`Store`] at hand (an outer map opening its inner maps).
pub fn open_object_in(dir: &StoreDir, kind: ObjectKind, id: u32) -> Result<(File, PathBuf)> {
    let name = object_name(kind, id);
    let path = dir.shown(&name);
    let file = dir.open(&name, libc::O_RDWR).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Error::NoObject {
                kind: kind.prefix(),
                id,
            }
        } else {
            Error::io("open", &path, e)
        }
    })?;
    Ok((file, path))
}

/// Creates the store's table of CPU slots (`cpu_slots.rs`) in `dir` unless it is there.
fn create_cpu_table(dir: &StoreDir) -> Result<()> {
    if dir.exists("cpus") {
        return Ok(());
    }
    let cpus = possible_cpus();
    let tmp = format!(".tmp-cpus-{}", std::process::id());
    let shown = dir.shown(&tmp);
    let result = (|| {
        let file = dir
            .create_temporary(&tmp)
            .map_err(|e| Error::io("create", &shown, e))?;
        let len = CPU_SLOT_STRIDE * (1 + cpus as usize);
        file.set_len(len as u64)
            .map_err(|e| Error::io("resize", &shown, e))?;
        let m = Mapping::map_file(&file, len, &shown)?;
        // SAFETY: a fresh file of `len` bytes, private to this process until linked.
        unsafe {
            m.base().cast::<CpuSlotsHeader>().write(CpuSlotsHeader {
                magic: CPU_SLOTS_MAGIC,
                version: STORE_VERSION,
                cpus,
                _pad: 0,
            })
        };
        // link() refuses to replace, so racing creators agree on one table.
        match dir.link(&tmp, "cpus") {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(Error::io("create", dir.shown("cpus"), e)),
        }
    })();
    let _ = dir.unlink(&tmp);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the fuzzer (fuzz/, target store_files): a store file shorter than its
    /// header was mapped whole, and reading the header raised SIGBUS.
    #[test]
    fn a_truncated_store_header_is_refused_not_a_sigbus() {
        let name = format!("unit-store-short-{}", std::process::id());
        let dir = Store::dir_for(&name);
        let _ = fs::remove_dir_all(&dir);
        drop(Store::create_or_open(&name).unwrap());
        let path = dir.join("store");
        let whole = fs::read(&path).unwrap();
        for cut in [0, 4, 20, whole.len() - 1] {
            fs::write(&path, &whole[..cut]).unwrap();
            let err = Store::open(&name).err().expect("a short header is refused");
            assert_eq!(err.errno(), libc::EINVAL);
            assert!(
                err.to_string().contains("shorter than a store header"),
                "{err}"
            );
        }
        fs::write(&path, &whole).unwrap();
        assert!(Store::open(&name).is_ok());
        let _ = fs::remove_dir_all(&dir);
    }
}
