//! Objects live as long as the kernel's would: while a descriptor in some process, a
//! pin, or an object that uses them refers to them. A tool that exits (or is killed)
//! leaves nothing; a pinned map outlives it and the next tool reuses it; a link keeps
//! its probe in a target only while it exists. Pinning's answers are the kernel's.

mod support;

use bpftime_runtime::{Map, ObjectKind, Store};
use bpftime_tests::{examples, kernel_bpffs_unavailable, Session};
use std::process::Command;
use support::{code_in_file, code_in_memory, hex_field, wait_until, Driven};

/// What `bpftime list` shows, less its header line.
fn listed(s: &Session) -> Vec<String> {
    let out = s.bpftime().arg("list").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .map(str::to_string)
        .collect()
}

fn count(lines: &[String], prefix: &str) -> usize {
    lines.iter().filter(|l| l.starts_with(prefix)).count()
}

/// Runs the `pinning` tool (under bpftime when `s` is given, on the kernel
/// otherwise) with `commands` on stdin; returns its answers, one per command.
fn pinning(s: Option<&Session>, pin_root: &str, commands: &[String]) -> Vec<String> {
    let mut c = match s {
        Some(s) => {
            let mut c = s.bpftime();
            c.arg("load").arg(examples::PINNING);
            c
        }
        None => Command::new(examples::PINNING),
    };
    c.args(["--pin-root", pin_root]);
    let mut tool = Driven::spawn(c);
    tool.wait_for("loaded");
    for cmd in commands {
        tool.send(cmd);
    }
    let (status, rest, err) = tool.finish();
    assert!(status.success(), "pinning failed: {err}");
    assert_eq!(
        rest.len(),
        commands.len(),
        "{commands:?} -> {rest:?}\n{err}"
    );
    rest
}

fn cmds(list: &[&str], root: &str) -> Vec<String> {
    list.iter().map(|c| c.replace("ROOT", root)).collect()
}

/// Removes a kernel pin directory left by a failed run.
struct KernelPins(String);

impl Drop for KernelPins {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_tool_that_exits_leaves_nothing_and_feature_probes_leave_nothing_while_it_runs() {
    let s = Session::new("life-exit");
    let tool = s.load(&[examples::MALLOC_COUNT]);
    let l = listed(&s);
    // Exactly the tool's own objects: libbpf's feature probes closed theirs.
    assert_eq!(count(&l, "map "), 3, "{l:#?}");
    assert_eq!(count(&l, "prog "), 1, "{l:#?}");
    assert_eq!(count(&l, "link "), 1, "{l:#?}");
    assert_eq!(count(&l, "perf "), 1, "{l:#?}");
    assert!(
        !l.iter()
            .any(|x| x.contains("libbpf_nametest") || x.contains("insns 2 ")),
        "feature probes left objects: {l:#?}"
    );
    let (code, _, err) = tool.stop();
    assert_eq!(code, 0, "{err}");
    let l = listed(&s);
    assert!(l.is_empty(), "left after the tool exited: {l:#?}");
    let files: Vec<String> = std::fs::read_dir(Store::dir_for(&s.store))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !["store", "pins", "trace_pipe", "cpus"].contains(&n.as_str()))
        .collect();
    assert!(files.is_empty(), "files left in the store: {files:?}");
}

#[test]
fn a_killed_tool_leaves_nothing() {
    let s = Session::new("life-kill");
    let tool = s.load(&[examples::MALLOC_COUNT]);
    assert_eq!(count(&listed(&s), "prog "), 1);
    tool.kill(); // SIGKILL: nothing of the tool's runs after this.
    let l = listed(&s);
    assert!(l.is_empty(), "left after SIGKILL: {l:#?}");
}

const PIN_SCRIPT_1: &[&str] = &[
    "set 0 42",
    "get 0",
    "pin_scratch ROOT/scratch",
    "pin_scratch ROOT/scratch",
    "pin_scratch /sys/fs/bpf/no-such-dir-bpftime/x",
    "pin_scratch ROOT",
    "obj_get ROOT/missing",
    "obj_get ROOT",
    "obj_get /nonexistent-bpftime",
    "obj_get ROOT/scratch",
    "fd_get 0",
];

const PIN_SCRIPT_2: &[&str] = &[
    "get 0",
    "obj_get ROOT/scratch",
    "close_fd",
    "unlink ROOT/scratch",
    "unlink ROOT/scratch",
    "obj_get ROOT/scratch",
    "unpin_counts",
    "unpin_counts",
];

#[test]
fn pinned_maps_outlive_their_tool_are_reused_and_freed_when_unpinned_as_on_the_kernel() {
    let s = Session::new("life-pin");
    let root = "/sys/fs/bpf/bpftime-life-test";
    let first = pinning(Some(&s), root, &cmds(PIN_SCRIPT_1, root));
    assert_eq!(first[0], "set=0");
    assert_eq!(first[2], "pin=0", "{first:?}");
    assert_eq!(first[3], "pin=-17", "pinning twice is EEXIST: {first:?}");
    assert_eq!(first[6], "get=-2", "a missing pin is ENOENT: {first:?}");
    assert_eq!(first[9], "get=0 type=1 key=4 value=8 max=16", "{first:?}");

    // Both pins survive the tool; its program and everything else do not.
    let l = listed(&s);
    assert_eq!(count(&l, "map "), 2, "{l:#?}");
    assert_eq!(count(&l, "pin "), 2, "{l:#?}");
    assert_eq!(count(&l, "prog "), 0, "{l:#?}");
    let store = Store::open(&s.store).unwrap();
    let pinned: Vec<u32> = store.pins().iter().map(|p| p.id).collect();

    // A second tool reuses the map pinned by name (libbpf compares its info) and
    // reads what the first one wrote; it unpins both and they are freed.
    let second = pinning(Some(&s), root, &cmds(PIN_SCRIPT_2, root));
    assert_eq!(
        second[0], "value=42",
        "the pinned map was reused: {second:?}"
    );
    assert_eq!(second[1], "get=0 type=1 key=4 value=8 max=16");
    assert_eq!(
        &second[3..],
        ["unlink=0", "unlink=-2", "get=-2", "unpin=0", "unpin=-2"]
    );
    let l = listed(&s);
    assert!(l.is_empty(), "left after unpinning: {l:#?}");
    for id in pinned {
        assert!(Map::open(&store, id).is_err(), "map {id} was not freed");
    }

    // The kernel answers the same.
    if let Some(why) = kernel_bpffs_unavailable() {
        eprintln!("kernel comparison skipped: {why}");
        return;
    }
    let kroot = format!("/sys/fs/bpf/bpftime-life-{}", std::process::id());
    let _cleanup = KernelPins(kroot.clone());
    let k1 = pinning(None, &kroot, &cmds(PIN_SCRIPT_1, &kroot));
    let k2 = pinning(None, &kroot, &cmds(PIN_SCRIPT_2, &kroot));
    assert_eq!(first, k1, "bpftime vs the kernel, first tool");
    assert_eq!(second, k2, "bpftime vs the kernel, second tool");
}

#[test]
fn a_path_outside_bpffs_is_refused_as_the_kernel_refuses_it() {
    let s = Session::new("life-outside");
    let script = ["pin_scratch /tmp/bpftime-not-bpffs", "obj_get /tmp"];
    let root = "/sys/fs/bpf/bpftime-life-outside";
    let ours = pinning(Some(&s), root, &cmds(&script, root));
    assert_eq!(ours, ["pin=-1", "get=-13"]);
    let l = listed(&s);
    assert_eq!(
        count(&l, "pin "),
        1,
        "only libbpf's pin of `counts`: {l:#?}"
    );
    if let Some(why) = kernel_bpffs_unavailable() {
        eprintln!("kernel comparison skipped: {why}");
    } else {
        let kroot = format!("/sys/fs/bpf/bpftime-life-o{}", std::process::id());
        let _cleanup = KernelPins(kroot.clone());
        assert_eq!(pinning(None, &kroot, &cmds(&script, &kroot)), ours);
    }
}

/// The `pinning` tool, running, driven line by line.
fn pinning_tool(s: &Session) -> Driven {
    let mut c = s.bpftime();
    c.args(["load", examples::PINNING, "--pin-root", "/sys/fs/bpf/life"]);
    let mut tool = Driven::spawn(c);
    tool.wait_for("loaded");
    tool
}

#[test]
fn a_link_probes_while_a_tool_or_a_pin_holds_it_and_detaches_when_the_last_goes() {
    let s = Session::new("life-link");
    let t = s.target_copy(examples::TICKER);
    let t = t.to_str().unwrap();
    let mut target_cmd = s.bpftime();
    target_cmd.args(["start", t]);
    let mut target = Driven::spawn(target_cmd);
    let pid = target.pid();
    let work = hex_field(&target.wait_for("work="), "work");
    let original = code_in_file(pid, work, 8);
    let hooked = || code_in_memory(pid, work, 1) == [0xe9];

    // Held by a running tool's descriptor: probes fire.
    let mut tool = pinning_tool(&s);
    tool.send(&format!("attach {t} work"));
    assert_eq!(tool.wait_for("attach="), "attach=0");
    wait_until("the agent hooks work()", hooked);
    target.send("10");
    target.wait_for("done total=10");
    tool.send("get 0");
    assert_eq!(tool.wait_for("value="), "value=10");
    // The tool exits without detaching: its descriptors close, the link goes.
    let (status, _, err) = tool.finish();
    assert!(status.success(), "{err}");
    wait_until("the agent unhooks work()", || {
        code_in_memory(pid, work, 8) == original
    });
    target.send("5");
    target.wait_for("done total=15");

    // Pinned, the link outlives the tool that made it.
    let mut tool = pinning_tool(&s);
    tool.send("get 0");
    assert_eq!(
        tool.wait_for("value="),
        "value=10",
        "not counted after the exit"
    );
    tool.send(&format!("attach {t} work"));
    assert_eq!(tool.wait_for("attach="), "attach=0");
    tool.send("pin_link /sys/fs/bpf/life/link");
    assert_eq!(tool.wait_for("pin="), "pin=0");
    let (status, _, err) = tool.finish();
    assert!(status.success(), "{err}");
    wait_until("the agent hooks work()", hooked);
    let l = listed(&s);
    assert_eq!(count(&l, "link "), 1, "{l:#?}");
    assert_eq!(count(&l, "prog "), 1, "the link holds its program: {l:#?}");
    target.send("7");
    target.wait_for("done total=22");

    // Another tool unpins it: the last reference goes, and so does the probe.
    let mut tool = pinning_tool(&s);
    tool.send("get 0");
    assert_eq!(tool.wait_for("value="), "value=17");
    tool.send("unlink /sys/fs/bpf/life/link");
    assert_eq!(tool.wait_for("unlink="), "unlink=0");
    wait_until("the agent unhooks work()", || {
        code_in_memory(pid, work, 8) == original
    });
    target.send("3");
    target.wait_for("done total=25");
    tool.send("get 0");
    assert_eq!(tool.wait_for("value="), "value=17");
    tool.send("unpin_counts");
    assert_eq!(tool.wait_for("unpin="), "unpin=0");
    let (status, _, err) = tool.finish();
    assert!(status.success(), "{err}");
    let (status, _, err) = target.finish();
    assert!(status.success(), "{err}");
    let l = listed(&s);
    assert!(l.is_empty(), "{l:#?}");
}

/// Several processes open and close descriptors of one pinned map as fast as they
/// can, each close running a collection, while one tool holds the map: the map is
/// never freed under them, and nothing is left once the last reference goes.
#[test]
fn concurrent_opens_and_closes_never_free_a_held_object_nor_leak_one() {
    const WORKERS: usize = 4;
    const ROUNDS: usize = 60;
    let s = Session::new("life-stress");
    let mut holder = pinning_tool(&s);
    holder.send("pin_scratch /sys/fs/bpf/life/shared");
    assert_eq!(holder.wait_for("pin="), "pin=0");
    holder.send("ids");
    let ids = holder.wait_for("ids ");
    let shared: u32 = ids
        .split_whitespace()
        .find_map(|w| w.strip_prefix("scratch="))
        .and_then(|v| v.parse().ok())
        .unwrap();
    let store = Store::open(&s.store).unwrap();
    let path = store.path(ObjectKind::Map, shared);

    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let mut w = pinning_tool(&s);
        for _ in 0..ROUNDS {
            w.send("obj_get /sys/fs/bpf/life/shared");
            w.send("fd_get 0");
            w.send("close_fd");
        }
        workers.push(w);
    }
    let mut results = Vec::new();
    for w in workers {
        // While workers run, the shared map never leaves the store.
        assert!(path.exists(), "map {shared} freed while pinned and held");
        let (status, rest, err) = w.finish();
        assert!(status.success(), "{err}");
        results.push(rest);
    }
    for rest in &results {
        assert_eq!(rest.len(), 3 * ROUNDS, "{rest:?}");
        for round in rest.chunks(3) {
            assert_eq!(round[0], "get=0 type=1 key=4 value=8 max=16");
            assert_eq!(round[1], "value=-2", "an empty hash map slot");
            assert_eq!(round[2], "closed");
        }
    }
    assert!(path.exists());
    // Unpinned, the holder's descriptor still keeps it.
    holder.send("unlink /sys/fs/bpf/life/shared");
    assert_eq!(holder.wait_for("unlink="), "unlink=0");
    assert!(path.exists(), "freed while the holder has a descriptor");
    holder.send("unpin_counts");
    assert_eq!(holder.wait_for("unpin="), "unpin=0");
    let (status, _, err) = holder.finish();
    assert!(status.success(), "{err}");
    assert!(!path.exists(), "map {shared} leaked");
    let l = listed(&s);
    assert!(l.is_empty(), "{l:#?}");
}

/// Threads, each with a shim of its own (so each descriptor is its own open file
/// description, as in separate processes), open one map by id, use it and close it in
/// a loop, collecting after every close, while its creator lets go of it at some
/// point: no thread ever holds a freed map, a lookup by id fails only once the
/// creator has let go, and the map is freed once the last descriptor closes.
#[test]
fn racing_opens_by_id_and_collections_never_free_a_held_map() {
    use bpftime_isa::uapi::cmd;
    use bpftime_shim::Shim;
    use bpftime_tests::bpf::{put32, put64, Bpf, Ours};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    const THREADS: usize = 4;
    const ROUNDS: usize = 100;
    const ITERATIONS: usize = 50;
    let s = Session::new("life-race");
    let store = Store::create_or_open(&s.store).unwrap();
    for iteration in 0..ITERATIONS {
        let mut creator = Ours(Shim::new(Store::open(&s.store).unwrap()));
        let mut a = [0u8; 128];
        put32(&mut a, 0, 2); // BPF_MAP_TYPE_ARRAY
        put32(&mut a, 4, 4);
        put32(&mut a, 8, 8);
        put32(&mut a, 12, 1);
        let fd = creator.call(cmd::MAP_CREATE, &mut a).unwrap() as i32;
        let id = *store.ids(ObjectKind::Map).last().unwrap();
        let path = store.path(ObjectKind::Map, id);
        let released = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..THREADS)
            .map(|_| {
                let (name, path, released) = (s.store.clone(), path.clone(), released.clone());
                std::thread::spawn(move || {
                    let mut shim = Ours(Shim::new(Store::open(&name).unwrap()));
                    let mut opened = 0;
                    for _ in 0..ROUNDS {
                        let mut a = [0u8; 128];
                        put32(&mut a, 0, id);
                        match shim.call(cmd::MAP_GET_FD_BY_ID, &mut a) {
                            Ok(fd) => {
                                let fd = fd as i32;
                                opened += 1;
                                assert!(path.exists(), "map {id} freed while held");
                                let (key, mut value) = (0u32, 0u64);
                                let mut a = [0u8; 128];
                                put32(&mut a, 0, fd as u32);
                                put64(&mut a, 8, &key as *const u32 as u64);
                                put64(&mut a, 16, &mut value as *mut u64 as u64);
                                shim.call(cmd::MAP_LOOKUP_ELEM, &mut a).unwrap();
                                assert!(shim.0.close(fd));
                                // SAFETY: closes the descriptor the shim gave this thread.
                                unsafe { libc::close(fd) };
                                shim.0.collect();
                            }
                            Err(e) => {
                                assert_eq!(e, libc::ENOENT);
                                // The creator says it lets go before it does: a map freed
                                // under this call was let go of before this load.
                                assert!(
                                    released.load(Ordering::SeqCst),
                                    "map {id} not found while its creator held it"
                                );
                            }
                        }
                    }
                    opened
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_micros(
            200 * (iteration as u64 % 10),
        ));
        released.store(true, Ordering::SeqCst);
        assert!(creator.0.close(fd));
        // SAFETY: the creator's descriptor, closed once.
        unsafe { libc::close(fd) };
        creator.0.collect();
        for t in threads {
            t.join().expect("a racing thread failed");
        }
        bpftime_runtime::collect_garbage(&store);
        assert!(!path.exists(), "map {id} leaked (iteration {iteration})");
    }
    assert!(store.ids(ObjectKind::Map).is_empty());
}
