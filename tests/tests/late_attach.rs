//! A target started first, a tool loaded while it runs: the agent attaches
//! the tool's probe without a restart, counts exactly the calls made after
//! that, and takes the probe out again when the tool exits.

mod support;

use bpftime_runtime::{Map, ObjectKind, Store};
use bpftime_tests::{examples, Session};
use support::{code_in_file, code_in_memory, hex_field, wait_until, Driven};

/// The tool's `.bss` map (libbpf names it `<object prefix>.bss`), opened
/// straight from the store so it can be read after the tool is gone.
fn bss_map(store: &Store) -> Map {
    store
        .ids(ObjectKind::Map)
        .into_iter()
        .filter_map(|id| Map::open(store, id).ok())
        .find(|m| m.name().ends_with(".bss"))
        .expect("the tool's .bss map is in the store")
}

fn bss_bytes(m: &Map) -> Vec<u8> {
    let mut v = vec![0u8; m.value_size() as usize];
    m.lookup(&0u32.to_ne_bytes(), &mut v).expect("read .bss");
    v
}

#[test]
fn a_tool_loaded_after_the_target_counts_what_follows_and_detaches_on_exit() {
    let s = Session::new("late");
    let t = s.target_copy(examples::TICKER);
    let t = t.to_str().unwrap();

    let mut target_cmd = s.bpftime();
    target_cmd.args(["start", t]);
    let mut target = Driven::spawn(target_cmd);
    let pid = target.pid();
    let work = hex_field(&target.wait_for("work="), "work");
    let original = code_in_file(pid, work, 8);
    assert_eq!(
        code_in_memory(pid, work, 8),
        original,
        "nothing attached yet"
    );
    target.send("50");
    target.wait_for("done total=50");

    let mut tool_cmd = s.bpftime();
    tool_cmd.args(["load", examples::GLOBALS, "--target", t, "--func", "work"]);
    let mut tool = Driven::spawn(tool_cmd);
    tool.wait_for("ready");
    // The agent follows the store and hooks `work` on its own; the hook's jump
    // in the target's code says it is in place.
    wait_until("the agent hooks work()", || {
        code_in_memory(pid, work, 1) == [0xe9]
    });

    target.send("100");
    target.wait_for("done total=150");
    tool.send("show");
    assert_eq!(
        tool.wait_for("calls="),
        "calls=100 sum=100 last_arg=149 last_weight=1",
        "exactly the calls made after attach (arguments 50..149)"
    );
    let store = Store::open(&s.store).unwrap();
    let bss = bss_map(&store);
    let before = bss_bytes(&bss);
    target.send("1");
    target.wait_for("done total=151");
    assert_ne!(bss_bytes(&bss), before, "the store's .bss is the tool's");

    let (status, rest, err) = tool.finish();
    assert!(status.success(), "tool failed: {err}");
    assert_eq!(rest, vec!["calls=101 sum=101 last_arg=150 last_weight=1"]);

    // The tool is gone: the target's code is its own again, no link is left,
    // and calls no longer reach the program.
    wait_until("the agent unhooks work()", || {
        code_in_memory(pid, work, 8) == original
    });
    let list = s.bpftime().arg("list").output().unwrap();
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(
        !text.lines().any(|l| l.starts_with("link ")),
        "links remain after the tool exited:\n{text}"
    );
    let after_exit = bss_bytes(&bss);
    target.send("100");
    target.wait_for("done total=251");
    assert_eq!(
        bss_bytes(&bss),
        after_exit,
        "a call was counted after detach"
    );
    let (status, _, err) = target.finish();
    assert!(status.success(), "target failed: {err}");
}

#[test]
fn a_second_tool_attaches_to_a_target_that_outlived_the_first() {
    let s = Session::new("late2");
    let t = s.target_copy(examples::TICKER);
    let t = t.to_str().unwrap();
    let mut target_cmd = s.bpftime();
    target_cmd.args(["start", t]);
    let mut target = Driven::spawn(target_cmd);
    let pid = target.pid();
    let work = hex_field(&target.wait_for("work="), "work");
    let original = code_in_file(pid, work, 8);
    let mut total = 0;
    for (round, n) in [(1, 30u64), (2, 70)] {
        let mut tool_cmd = s.bpftime();
        tool_cmd.args(["load", examples::GLOBALS, "--target", t, "--func", "work"]);
        let mut tool = Driven::spawn(tool_cmd);
        tool.wait_for("ready");
        wait_until("the agent hooks work()", || {
            code_in_memory(pid, work, 1) == [0xe9]
        });
        target.send(&n.to_string());
        total += n;
        target.wait_for(&format!("done total={total}"));
        let (status, rest, err) = tool.finish();
        assert!(status.success(), "tool {round} failed: {err}");
        assert_eq!(
            rest,
            vec![format!(
                "calls={n} sum={n} last_arg={} last_weight=1",
                total - 1
            )],
            "tool {round}"
        );
        wait_until("the agent unhooks work()", || {
            code_in_memory(pid, work, 8) == original
        });
    }
    let (status, _, err) = target.finish();
    assert!(status.success(), "target failed: {err}");
}

/// A target that exits while its agent compiles a tool's program that just arrived exits
/// with its own status: `exit()` destroys LLVM's static objects, and it once did so under
/// the compile, which then died of SIGSEGV (the target's status 139 instead of 0).
/// The target leaves as soon as the tool is ready, a few milliseconds apart from one round
/// to the next, which is while the agent compiles.
#[test]
fn a_target_exiting_while_a_tool_attaches_keeps_its_exit_status() {
    let s = Session::new("late-exit");
    let t = s.target_copy(examples::TICKER);
    let t = t.to_str().unwrap();
    for round in 0..30u64 {
        let mut target_cmd = s.bpftime();
        target_cmd.args(["start", t]);
        let mut target = Driven::spawn(target_cmd);
        target.wait_for("work=");
        let mut tool_cmd = s.bpftime();
        tool_cmd.args(["load", examples::GLOBALS, "--target", t, "--func", "work"]);
        let mut tool = Driven::spawn(tool_cmd);
        tool.wait_for("ready");
        std::thread::sleep(std::time::Duration::from_millis(round % 6));
        let (status, _, err) = target.finish();
        assert!(
            status.success(),
            "round {round}: the target exited with {status:?}\n{err}"
        );
        let (status, _, err) = tool.finish();
        assert!(status.success(), "round {round}: tool failed: {err}");
    }
}
