//! Local storage (task, inode, socket and cgroup storage): a value per owner, in a
//! hash keyed by the owner's identity so that every process mapping the store sees
//! the same values. User space names an owner by a file descriptor (a pidfd, any
//! file, a socket, a cgroup2 directory), as the kernel's `bpf()` does; a program
//! names a task by the token `bpf_get_current_task_btf()` gives it.
//!
//! A task is its thread id together with its start time, so that a thread reusing a
//! dead thread's id does not inherit its storage; storage of dead threads is reclaimed
//! when the map fills. Thread ids are the ones of the pid namespace of whoever asks:
//! a tool and its target in different pid namespaces do not agree on them.

use super::{err, hash, Map};
use crate::Result;
use bpftime_isa::uapi::{map_flags, map_type, update_flags};

/// Owners one map holds at most. The kernel has no limit (storage hangs off each
/// owner); shared memory needs one, and the storage of threads that ended is reclaimed
/// when it is reached.
pub const CAPACITY: u32 = 4096;

/// The largest value the kernel (6.18) takes: `U16_MAX` less its element header.
pub const MAX_VALUE_SIZE: u32 = 65_407;

/// The internal key: who owns a value.
pub const KEY_SIZE: usize = 16;

/// Whose storage a map is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    Task,
    Inode,
    Sock,
    Cgroup,
}

impl Owner {
    pub(crate) fn of(t: u32) -> Option<Owner> {
        Some(match t {
            map_type::TASK_STORAGE => Owner::Task,
            map_type::INODE_STORAGE => Owner::Inode,
            map_type::SK_STORAGE => Owner::Sock,
            map_type::CGRP_STORAGE => Owner::Cgroup,
            _ => return None,
        })
    }
}

/// The kernel's creation checks for every local storage type.
pub fn check_spec(s: &super::MapSpec) -> Result<()> {
    let allowed = map_flags::NO_PREALLOC | map_flags::CLONE;
    if s.map_flags & !allowed != 0
        || s.map_flags & map_flags::NO_PREALLOC == 0
        || s.max_entries != 0
        || s.key_size != 4
        || s.value_size == 0
        || s.btf_key_type_id == 0
        || s.btf_value_type_id == 0
    {
        return Err(err(
            libc::EINVAL,
            "local storage needs BPF_F_NO_PREALLOC (and no other flag but BPF_F_CLONE), max_entries 0, a 4-byte key, a value, and BTF for both",
        ));
    }
    if s.value_size > MAX_VALUE_SIZE {
        return Err(err(libc::E2BIG, "local storage value too large"));
    }
    Ok(())
}

/// A task as programs and user space both name it: (thread id, start time in
/// clock ticks since boot).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskToken {
    pub tid: u64,
    pub start: u64,
}

impl TaskToken {
    fn key(&self) -> [u8; KEY_SIZE] {
        let mut k = [0u8; KEY_SIZE];
        k[..8].copy_from_slice(&self.tid.to_ne_bytes());
        k[8..].copy_from_slice(&self.start.to_ne_bytes());
        k
    }
}

/// The start time of thread `tid` (field 22 of its `stat`), if it lives.
pub fn start_time(tid: u64) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{tid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields resume after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The task a pidfd refers to, with the kernel's errors: `EBADF` for a descriptor
/// that is not a pidfd, `ESRCH` for a task that ended.
fn task_of_pidfd(fd: i32) -> std::result::Result<TaskToken, i32> {
    // SAFETY: F_GETFD only asks whether `fd` is open.
    if fd < 0 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(libc::EBADF);
    }
    let info =
        std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).map_err(|_| libc::EBADF)?;
    let pid: i64 = info
        .lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or(libc::EBADF)?;
    if pid <= 0 {
        return Err(libc::ESRCH);
    }
    let tid = pid as u64;
    let start = start_time(tid).ok_or(libc::ESRCH)?;
    Ok(TaskToken { tid, start })
}

fn stat_of(fd: i32) -> std::result::Result<libc::stat, i32> {
    // SAFETY: a plain out-struct; an invalid fd is an error return.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if fd < 0 || unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(libc::EBADF);
    }
    Ok(st)
}

/// The owner behind the file descriptor user space passes as the key, as its
/// internal key, or the kernel's errno.
fn owner_key(owner: Owner, fd: i32) -> std::result::Result<[u8; KEY_SIZE], i32> {
    let pair = |a: u64, b: u64| {
        let mut k = [0u8; KEY_SIZE];
        k[..8].copy_from_slice(&a.to_ne_bytes());
        k[8..].copy_from_slice(&b.to_ne_bytes());
        k
    };
    match owner {
        Owner::Task => task_of_pidfd(fd).map(|t| t.key()),
        Owner::Inode => stat_of(fd).map(|st| pair(st.st_dev, st.st_ino)),
        Owner::Sock => {
            let st = stat_of(fd)?;
            if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
                return Err(libc::ENOTSOCK);
            }
            Ok(pair(st.st_dev, st.st_ino))
        }
        Owner::Cgroup => {
            // SAFETY: a plain out-struct; an invalid fd is an error return.
            let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            let ok = fd >= 0 && unsafe { libc::fstatfs(fd, &mut fs) } == 0;
            // f_type is an i64 on x86-64 and narrower on some other architectures.
            #[allow(clippy::unnecessary_cast)]
            if !ok || fs.f_type as i64 != bpftime_store::cgroup::CGROUP2_SUPER_MAGIC {
                return Err(libc::EBADF);
            }
            stat_of(fd).map(|st| pair(st.st_dev, st.st_ino))
        }
    }
}

fn fd_of(key: &[u8]) -> Result<i32> {
    key.try_into()
        .map(i32::from_ne_bytes)
        .map_err(|_| err(libc::EINVAL, "key size mismatch"))
}

fn resolve(owner: Owner, key: &[u8]) -> Result<[u8; KEY_SIZE]> {
    owner_key(owner, fd_of(key)?).map_err(|e| err(e, "no such owner for local storage"))
}

pub fn lookup(map: &Map, owner: Owner, key: &[u8], value: &mut [u8]) -> Result<()> {
    let k = resolve(owner, key)?;
    hash::lookup(map, &k, value)
}

pub fn update(map: &Map, owner: Owner, key: &[u8], value: &[u8], flags: u64) -> Result<()> {
    // The kernel refuses BPF_F_LOCK before it looks at the owner (no value here holds
    // a spin lock), and other flags after.
    if flags & update_flags::LOCK != 0 {
        return Err(err(libc::EINVAL, "no spin lock in the value"));
    }
    let k = resolve(owner, key)?;
    if flags > update_flags::EXIST {
        return Err(err(libc::EINVAL, "unknown update flags"));
    }
    insert(map, owner, &k, value.as_ptr(), flags)
}

pub fn delete(map: &Map, owner: Owner, key: &[u8]) -> Result<()> {
    let k = resolve(owner, key)?;
    hash::delete(map, k.as_ptr())
}

/// Inserts, reclaiming the storage of threads that ended when the map is full.
fn insert(map: &Map, owner: Owner, key: &[u8], value: *const u8, flags: u64) -> Result<()> {
    match hash::update(map, key, value, flags, false) {
        Err(e) if e.errno() == libc::E2BIG && owner == Owner::Task && reclaim(map) > 0 => {
            hash::update(map, key, value, flags, false)
        }
        Err(e) if e.errno() == libc::E2BIG => Err(err(libc::ENOMEM, "local storage is full")),
        r => r,
    }
}

/// Deletes the storage of tasks that ended (or whose id went to another thread);
/// returns how many.
fn reclaim(map: &Map) -> usize {
    let mut dead = vec![];
    let mut at: Option<[u8; KEY_SIZE]> = None;
    let mut next = [0u8; KEY_SIZE];
    while hash::next_key(map, at.as_ref().map(|k| &k[..]), &mut next).is_ok() {
        let tid = u64::from_ne_bytes(next[..8].try_into().expect("8 bytes"));
        let start = u64::from_ne_bytes(next[8..].try_into().expect("8 bytes"));
        if start_time(tid) != Some(start) {
            dead.push(next);
        }
        at = Some(next);
        if dead.len() + 1 > CAPACITY as usize * 2 {
            break;
        }
    }
    let n = dead
        .iter()
        .filter(|k| hash::delete(map, k.as_ptr()).is_ok())
        .count();
    tracing::debug!(
        map = map.id(),
        reclaimed = n,
        "task storage of ended threads reclaimed"
    );
    n
}

thread_local! {
    static TASK: std::cell::Cell<(u64, TaskToken)> = const {
        std::cell::Cell::new((u64::MAX, TaskToken { tid: 0, start: 0 }))
    };
}

/// The calling thread's task token, at an address that stays valid for the thread's
/// life: what `bpf_get_current_task{,_btf}` give a program. Its identity is computed
/// once per thread (and again in a forked child, whose thread id differs).
pub fn current_task() -> *const TaskToken {
    let gen = bpftime_store::thread::fork_generation();
    TASK.with(|c| {
        let (g, _) = c.get();
        if g != gen {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() } as u64;
            let start = start_time(tid).unwrap_or(0);
            c.set((gen, TaskToken { tid, start }));
        }
        // The token is the second field of the pair: (u64, TaskToken) is repr(Rust),
        // so take its address through the cell rather than by offset arithmetic.
        let p = c.as_ptr();
        // SAFETY: `p` is this thread's live cell; the field is read-only for programs.
        unsafe { std::ptr::addr_of!((*p).1) }
    })
}

/// `bpf_task_storage_get`: the value of `task`, created (from `init`, or zeroed) when
/// absent and `BPF_LOCAL_STORAGE_GET_F_CREATE` is set; null otherwise or on failure.
///
/// # Safety
/// `task` is null or a token from [`current_task`]; `init` is null or points to
/// `value_size` readable bytes.
pub unsafe fn prog_get(map: &Map, task: *const TaskToken, init: *const u8, flags: u64) -> *mut u8 {
    const F_CREATE: u64 = 1;
    if task.is_null() || flags & !F_CREATE != 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: caller obligation.
    let key = unsafe { *task }.key();
    // SAFETY: the key is KEY_SIZE bytes, the map's hash key size.
    let v = unsafe { hash::find_value(map, key.as_ptr()) };
    if !v.is_null() || flags & F_CREATE == 0 {
        return v;
    }
    let zeroes;
    let init = if init.is_null() {
        zeroes = vec![0u8; map.value_size() as usize];
        zeroes.as_ptr()
    } else {
        init
    };
    // Another process may have created it meanwhile (user space): NOEXIST then fails,
    // and the lookup below finds theirs.
    let _ = insert(map, Owner::Task, &key, init, update_flags::NOEXIST);
    // SAFETY: as above.
    unsafe { hash::find_value(map, key.as_ptr()) }
}

/// `bpf_task_storage_delete`.
///
/// # Safety
/// `task` is null or a token from [`current_task`].
pub unsafe fn prog_delete(map: &Map, task: *const TaskToken) -> Result<()> {
    if task.is_null() {
        return Err(err(libc::EINVAL, "no task"));
    }
    // SAFETY: caller obligation.
    let key = unsafe { *task }.key();
    hash::delete(map, key.as_ptr())
}
