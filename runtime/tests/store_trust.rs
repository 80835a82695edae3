//! A store belongs to one user: another user's directory (or one others may write in)
//! is refused with one clear line, nothing in it is used, links planted under the
//! names the store uses never make root write where they point, and another user can
//! neither read, change nor add objects in a store.
//!
//! Run as root, as CI does: the other user is uid/gid 4242 (no passwd entry needed),
//! taken on by a forked child that makes only plain system calls. Without root each test
//! says it skipped.

use bpftime_isa::uapi::map_type;
use bpftime_runtime::{Map, MapSpec, ObjectKind, PerfRing, ProgramRecord, Store};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const OTHER: u32 = 4242;

/// A private stand-in for /dev/shm (mode 1777, as it is), shared by this binary's tests.
fn shm_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("bpftime-trust-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o1777)).unwrap();
        // SAFETY: set once, before any test of this binary reads it (every test calls
        // this first, and the others wait on the OnceLock).
        unsafe { std::env::set_var("BPFTIME_SHM_ROOT", &root) };
        root
    })
}

fn is_root() -> bool {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() == 0 }
}

macro_rules! need_root {
    ($test:literal) => {
        if !is_root() {
            println!(
                "{}: skipped: needs root to act as a second user (uid {OTHER})",
                $test
            );
            return;
        }
        shm_root();
    };
}

fn c(p: impl AsRef<Path>) -> CString {
    CString::new(p.as_ref().as_os_str().as_bytes()).unwrap()
}

/// What the other user's child does, step by step, with nothing but system calls (the
/// test process has other threads, so the child must not allocate).
enum Step {
    Mkdir(CString, libc::mode_t),
    Write(CString, Vec<u8>),
    Symlink(CString, CString),
    /// An open that must fail with this errno.
    OpenFails(CString, libc::c_int, libc::c_int),
}

/// Runs `steps` as uid/gid 4242 in a forked child; the number of the first step that
/// went wrong, or None when all did what they should.
fn as_other_user(steps: &[Step]) -> Option<usize> {
    // SAFETY: the child makes only async-signal-safe system calls on data prepared here,
    // then _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: as above: plain system calls, no allocation.
        unsafe {
            let gid = OTHER as libc::gid_t;
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(gid, gid, gid) != 0
                || libc::setresuid(OTHER, OTHER, OTHER) != 0
            {
                libc::_exit(100);
            }
            libc::umask(0);
            for (i, step) in steps.iter().enumerate() {
                let ok = match step {
                    Step::Mkdir(p, mode) => libc::mkdir(p.as_ptr(), *mode) == 0,
                    Step::Write(p, bytes) => {
                        let fd = libc::open(
                            p.as_ptr(),
                            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
                            0o666 as libc::c_uint,
                        );
                        fd >= 0
                            && libc::write(fd, bytes.as_ptr().cast(), bytes.len())
                                == bytes.len() as isize
                            && libc::close(fd) == 0
                    }
                    Step::Symlink(target, link) => {
                        libc::symlink(target.as_ptr(), link.as_ptr()) == 0
                    }
                    Step::OpenFails(p, flags, errno) => {
                        let fd = libc::open(p.as_ptr(), *flags, 0o666 as libc::c_uint);
                        fd < 0 && *libc::__errno_location() == *errno
                    }
                };
                if !ok {
                    libc::_exit(1 + i as i32);
                }
            }
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status),
        "the child died: status {status:#x}"
    );
    match libc::WEXITSTATUS(status) {
        0 => None,
        100 => panic!("the child could not become uid {OTHER}"),
        n => Some(n as usize - 1),
    }
}

/// A root-owned file outside every store, which no link may make us write.
fn victim(tag: &str) -> (PathBuf, Vec<u8>) {
    let path =
        std::env::temp_dir().join(format!("bpftime-trust-victim-{tag}-{}", std::process::id()));
    let bytes = format!("root's own file ({tag}), not a store's\n").into_bytes();
    std::fs::write(&path, &bytes).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    (path, bytes)
}

/// The bytes of a real store header and of a real program record, as a squatter
/// would copy them from a store of their own.
fn real_store_files() -> (Vec<u8>, Vec<u8>) {
    let name = format!("source-{}", std::process::id());
    let s = Store::create_or_open(&name).unwrap();
    let id = s.alloc_id();
    ProgramRecord {
        id,
        prog_type: 2,
        expected_attach_type: 0,
        name: "squatter".into(),
        insns: vec![],
        map_ids: vec![],
        gpl: true,
        owner_pid: 0,
    }
    .publish(&s)
    .unwrap();
    let store = std::fs::read(s.dir().join("store")).unwrap();
    let prog = std::fs::read(s.path(ObjectKind::Program, id)).unwrap();
    s.destroy().unwrap();
    (store, prog)
}

/// Every file a store makes, by the names it gives them (pid: this process's).
fn store_file_names() -> Vec<String> {
    let pid = std::process::id();
    let mut names: Vec<String> = ["store", "cpus", "pins", "trace_pipe", "trace_pipe.consumed"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    names.push(format!(".tmp-store-{pid}"));
    names.push(format!(".tmp-cpus-{pid}"));
    for id in 1..=4 {
        for kind in ["map", "prog", "link", "perf", "btf"] {
            names.push(format!("{kind}-{id}"));
            names.push(format!(".tmp-{kind}-{id}-{pid}"));
        }
        names.push(format!("fifo-{id}"));
        names.push(format!("perfring-{id}"));
        names.push(format!("fifo-perf-{id}"));
    }
    names
}

fn listing(dir: &Path) -> Vec<(String, u64, u32)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            let m = e.path().symlink_metadata().unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                m.ino(),
                m.mode(),
            )
        })
        .collect();
    v.sort();
    v
}

fn assert_refused(r: Result<Store, bpftime_runtime::Error>, dir: &Path, why: &str) {
    let e = match r {
        Ok(_) => panic!("{} was used", dir.display()),
        Err(e) => e.to_string(),
    };
    assert!(!e.contains('\n'), "not one line: {e}");
    assert!(
        e.contains(&dir.display().to_string()),
        "names no directory: {e}"
    );
    assert!(e.contains(why), "says not `{why}`: {e}");
    assert!(
        e.contains("rm -rf") && e.contains("--store"),
        "gives no way out: {e}"
    );
}

#[test]
fn a_store_squatted_by_another_user_is_refused_and_nothing_of_it_used() {
    need_root!("a_store_squatted_by_another_user_is_refused_and_nothing_of_it_used");
    let (store_bytes, prog_bytes) = real_store_files();
    let (victim, victim_bytes) = victim("squat");
    let name = format!("squat-{}", std::process::id());
    let dir = Store::dir_for(&name);
    let mut steps = vec![
        Step::Mkdir(c(&dir), 0o777),
        Step::Write(c(dir.join("store")), store_bytes),
        Step::Write(c(dir.join("prog-1")), prog_bytes),
        Step::Write(c(dir.join("link-2")), b"a link record".to_vec()),
        Step::Mkdir(c(dir.join("pins")), 0o777),
        Step::Write(c(dir.join("pins/p")), b"prog 1\n".to_vec()),
    ];
    // And links under every other name the store gives a file.
    for n in store_file_names() {
        if !["store", "pins", "prog-1", "link-2"].contains(&n.as_str()) {
            steps.push(Step::Symlink(c(&victim), c(dir.join(n))));
        }
    }
    assert_eq!(as_other_user(&steps), None, "the squatter's set-up failed");
    let before = listing(&dir);

    assert_refused(Store::create_or_open(&name), &dir, "owned by uid 4242");
    assert_refused(Store::open(&name), &dir, "owned by uid 4242");

    assert_eq!(listing(&dir), before, "the squatted directory was changed");
    assert_eq!(std::fs::read(&victim).unwrap(), victim_bytes);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&victim);
}

#[test]
fn a_store_directory_others_may_write_in_or_a_link_to_one_is_refused() {
    need_root!("a_store_directory_others_may_write_in_or_a_link_to_one_is_refused");
    // Ours, but open to everyone.
    let name = format!("open-{}", std::process::id());
    let dir = Store::dir_for(&name);
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert_refused(Store::create_or_open(&name), &dir, "mode 0777");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    std::fs::remove_dir(&dir).unwrap();

    // A link another user put where our store goes, to a directory of ours.
    let name = format!("link-{}", std::process::id());
    let dir = Store::dir_for(&name);
    let ours = Store::create_or_open(&format!("linked-{}", std::process::id())).unwrap();
    assert_eq!(
        as_other_user(&[Step::Symlink(c(ours.dir()), c(&dir))]),
        None
    );
    assert_refused(Store::create_or_open(&name), &dir, "symbolic link");
    assert_refused(Store::open(&name), &dir, "symbolic link");
    std::fs::remove_file(&dir).unwrap();
    ours.destroy().unwrap();
}

#[test]
fn a_new_store_is_the_callers_alone() {
    need_root!("a_new_store_is_the_callers_alone");
    let dir = Store::dir_for("default");
    assert_eq!(
        dir.file_name().unwrap().to_str().unwrap(),
        "bpftime-0-default",
        "the default store is not per user"
    );
    let name = format!("modes-{}", std::process::id());
    let s = Store::create_or_open(&name).unwrap();
    Map::create(
        &s,
        &MapSpec {
            map_type: map_type::RINGBUF,
            max_entries: 4096,
            name: "events".into(),
            ..Default::default()
        },
    )
    .unwrap();
    PerfRing::create(&s, 1, 2 * bpftime_runtime::PAGE_SIZE).unwrap();
    let mode = |p: &Path| p.symlink_metadata().unwrap().mode() & 0o7777;
    assert_eq!(mode(s.dir()), 0o700);
    assert_eq!(mode(&s.dir().join("pins")), 0o700);
    for (name, _, _) in listing(s.dir()) {
        let p = s.dir().join(&name);
        if name != "pins" {
            assert_eq!(mode(&p), 0o600, "{name}");
        }
        assert_eq!(p.symlink_metadata().unwrap().uid(), 0, "{name}");
    }
    s.destroy().unwrap();
}

#[test]
fn links_planted_in_a_store_never_lead_writes_outside_it() {
    need_root!("links_planted_in_a_store_never_lead_writes_outside_it");
    let (victim, victim_bytes) = victim("links");
    let name = format!("links-{}", std::process::id());
    let dir = Store::dir_for(&name);
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let plant = |names: &[String]| {
        for n in names {
            let p = dir.join(n);
            let _ = std::fs::remove_file(&p);
            std::os::unix::fs::symlink(&victim, &p).unwrap();
        }
    };
    let all = store_file_names();
    plant(&all);
    // `store` is a link: nothing opens.
    let e = Store::create_or_open(&name)
        .err()
        .expect("opened a link as the store");
    assert!(e.to_string().contains("store"), "{e}");
    // `pins` is a link: refused.
    std::fs::remove_file(dir.join("store")).unwrap();
    let e = Store::create_or_open(&name)
        .err()
        .expect("used a link as pins/");
    assert!(e.to_string().contains("symbolic link"), "{e}");
    std::fs::remove_file(dir.join("pins")).unwrap();
    // The rest are links: the store opens (its temporaries are made anew, not
    // followed), and every object made or opened under a planted name fails or
    // replaces the link, never writing through it.
    let s = Store::create_or_open(&name).unwrap();
    let ringbuf = MapSpec {
        map_type: map_type::RINGBUF,
        max_entries: 4096,
        name: "events".into(),
        ..Default::default()
    };
    let array = MapSpec {
        map_type: map_type::ARRAY,
        key_size: 4,
        value_size: 8,
        max_entries: 4,
        name: "a".into(),
        ..Default::default()
    };
    // A ring buffer whose FIFO name is a link: refused.
    assert!(Map::create(&s, &ringbuf).is_err());
    // An array: its temporary and its name were links; it is made in their place.
    let m = Map::create(&s, &array).unwrap();
    m.update(&0u32.to_ne_bytes(), &7u64.to_ne_bytes(), 0)
        .unwrap();
    assert!(!s
        .dir()
        .join(format!("map-{}", m.id()))
        .symlink_metadata()
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(PerfRing::create(&s, 1, 2 * bpftime_runtime::PAGE_SIZE).is_err());
    assert!(PerfRing::open(&s, 2).is_err());
    assert!(s.open_object(ObjectKind::Program, 1).is_err());
    assert!(s.open_trace_pipe().is_err());
    assert!(s.open_trace_position().is_err());
    bpftime_runtime::helpers::set_trace_output(&s);
    bpftime_runtime::helpers::emit_trace("through a link?");
    assert!(bpftime_runtime::cpu_slots::install(&s).is_err());
    std::fs::create_dir(dir.join("pins")).ok();
    std::os::unix::fs::symlink(&victim, dir.join("pins/p")).unwrap();
    assert!(s.pin(Path::new("p"), ObjectKind::Map, m.id()).is_err());
    assert!(s.pinned_object(Path::new("p")).is_err());
    bpftime_runtime::collect_garbage(&s);

    assert_eq!(std::fs::read(&victim).unwrap(), victim_bytes);
    drop(m);
    s.destroy().unwrap();
    let _ = std::fs::remove_file(&victim);
}

#[test]
fn another_user_can_neither_read_change_nor_add_objects() {
    need_root!("another_user_can_neither_read_change_nor_add_objects");
    let name = format!("mine-{}", std::process::id());
    let s = Store::create_or_open(&name).unwrap();
    let m = Map::create(
        &s,
        &MapSpec {
            map_type: map_type::ARRAY,
            key_size: 4,
            value_size: 8,
            max_entries: 1,
            name: "secret".into(),
            ..Default::default()
        },
    )
    .unwrap();
    let before = listing(s.dir());
    let map = s.dir().join(format!("map-{}", m.id()));
    let steps = [
        Step::OpenFails(c(&map), libc::O_RDONLY, libc::EACCES),
        Step::OpenFails(c(&map), libc::O_RDWR, libc::EACCES),
        Step::OpenFails(c(s.dir().join("store")), libc::O_RDWR, libc::EACCES),
        Step::OpenFails(
            c(s.dir().join("prog-99")),
            libc::O_WRONLY | libc::O_CREAT,
            libc::EACCES,
        ),
        Step::OpenFails(c(s.dir()), libc::O_RDONLY | libc::O_DIRECTORY, libc::EACCES),
        Step::OpenFails(
            c(s.dir().join("pins/p")),
            libc::O_WRONLY | libc::O_CREAT,
            libc::EACCES,
        ),
    ];
    assert_eq!(
        as_other_user(&steps),
        None,
        "another user could open something of the store"
    );
    assert_eq!(
        listing(s.dir()),
        before,
        "another user added or changed something"
    );
    assert_eq!(s.ids(ObjectKind::Program), Vec::<u32>::new());
    assert!(s.pins().is_empty());
    drop(m);
    s.destroy().unwrap();
}
