//! A skeleton tool (`bpftool gen skeleton`, Debian's shared libbpf 1.1) under
//! `bpftime load`: it sets `.rodata` before load, reads `.bss` and writes
//! `.data` through the skeleton's memory-mapped sections while the target
//! runs, and every number it reads is the one the kernel gives.

mod support;

use bpftime_tests::{examples, kernel_unavailable, Session};
use std::process::Command;
use support::Driven;

/// Drives the `globals` tool and the `ticker` target through the same steps,
/// and returns what the tool printed.
fn transcript(tool: Command, target: Command) -> Vec<String> {
    let mut tool = Driven::spawn(tool);
    tool.wait_for("ready");
    let mut target = Driven::spawn(target);
    target.wait_for("work=");
    let mut said = Vec::new();
    // First batch: arguments 0..99, weight 1.
    target.send("100");
    target.wait_for("done total=100");
    tool.send("show");
    said.push(tool.wait_for("calls="));
    // The tool writes .data while the target runs; the next calls must see it.
    tool.send("weight 1000");
    said.push(tool.wait_for("weight="));
    target.send("100");
    target.wait_for("done total=200");
    tool.send("show");
    said.push(tool.wait_for("calls="));
    let (status, rest, err) = target.finish();
    assert!(status.success(), "target failed: {err}");
    assert!(rest.is_empty(), "{rest:?}");
    let (status, rest, err) = tool.finish();
    assert!(status.success(), "tool failed: {err}");
    said.extend(rest);
    said
}

#[test]
fn skeleton_tool_reads_and_writes_globals_while_the_target_runs() {
    let s = Session::new("skeleton");
    let t = s.target_copy(examples::TICKER);
    let t = t.to_str().unwrap();
    let mut tool = s.bpftime();
    tool.args([
        "load",
        examples::GLOBALS,
        "--target",
        t,
        "--func",
        "work",
        "--parity",
        "1",
    ]);
    let mut target = s.bpftime();
    target.args(["start", t]);
    let ours = transcript(tool, target);
    // Odd arguments only (.rodata): 50 of 0..99 at weight 1, then 50 of
    // 100..199 at the weight the tool wrote into .data mid-run.
    assert_eq!(
        ours,
        vec![
            "calls=50 sum=50 last_arg=99 last_weight=1",
            "weight=1000",
            "calls=100 sum=50050 last_arg=199 last_weight=1000",
            "calls=100 sum=50050 last_arg=199 last_weight=1000",
        ]
    );

    if let Some(why) = kernel_unavailable() {
        eprintln!("kernel comparison skipped: {why}");
        return;
    }
    let dir = s.tmp.join("kernel");
    std::fs::create_dir_all(&dir).unwrap();
    let kt = dir.join("ticker");
    bpftime_tests::copy_executable(examples::TICKER, &kt);
    let mut tool = Command::new(examples::GLOBALS);
    tool.args([
        "--target",
        kt.to_str().unwrap(),
        "--func",
        "work",
        "--parity",
        "1",
    ]);
    let kernel = transcript(tool, Command::new(&kt));
    assert_eq!(kernel, ours);
}

#[test]
fn skeleton_tool_without_a_filter_counts_every_call() {
    let s = Session::new("skeleton-all");
    let t = s.target_copy(examples::TICKER);
    let t = t.to_str().unwrap();
    let mut tool = s.bpftime();
    tool.args(["load", examples::GLOBALS, "--target", t, "--func", "work"]);
    let mut target = s.bpftime();
    target.args(["start", t]);
    let ours = transcript(tool, target);
    assert_eq!(
        ours[2], "calls=200 sum=100100 last_arg=199 last_weight=1000",
        "{ours:?}"
    );
}
