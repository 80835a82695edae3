//! USDT probes and probes inside functions: libbpf's `bpf_program__attach_usdt` (Debian's
//! libbpf 1.1, unmodified C loader) and bpftrace's `usdt:` under `bpftime load`, with
//! `<sys/sdt.h>` semaphores raised while attached, and a uprobe on a one-byte instruction
//! just before a loop head (a breakpoint: the 5-byte jump would overwrite the head). Each
//! is exact against a count by hand and against the kernel for the same run.

mod support;

use bpftime_tests::{examples, kernel_unavailable, require_bpftrace, Session, Tool};
use std::process::Command;
use std::time::Duration;
use support::{code_in_file, code_in_memory, hex_field, wait_until, Driven};

const N: u64 = 3000;

/// What usdt_count must print after `usdt_target n` (steps 0..n), counted by hand.
fn expected_counts(n: u64) -> String {
    let loops = |i: u64| i % 7 + 1;
    let ticks = n;
    let tick_sum: u64 = (0..n).map(|i| 3 * i).sum();
    let guarded_sum: u64 = (0..n).sum();
    let head: u64 = (0..n).map(loops).sum();
    // rdi counts down from k to 1 at the loop head.
    let head_sum: u64 = (0..n).map(loops).map(|k| k * (k + 1) / 2).sum();
    format!(
        "ticks={ticks} tick_sum={tick_sum} guarded={n} guarded_sum={guarded_sum} nop={n} head={head} head_sum={head_sum}"
    )
}

/// What usdt_target prints after `n` steps with `guarded` of them seeing the semaphore.
fn target_line(n: u64, guarded: u64) -> String {
    let total: u64 = (0..n).map(|i| i % 7 + 1).map(|k| k * (k + 1) / 2).sum();
    format!("total={total} guarded={guarded}")
}

fn counts_line(lines: &[String]) -> String {
    lines
        .iter()
        .find(|l| l.starts_with("ticks="))
        .cloned()
        .unwrap_or_else(|| panic!("usdt_count printed no counts: {lines:?}"))
}

#[test]
fn libbpf_usdt_and_a_one_byte_probe_site_match_a_hand_count_and_the_kernel() {
    let s = Session::new("usdt-libbpf");
    let t = s.target_copy(examples::USDT_TARGET);
    let t = t.to_str().unwrap();
    let tool = s.load(&[examples::USDT_COUNT, "--target", t]);
    let out = s.start(&[t, &N.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        target_line(N, N),
        "the guarded probe's semaphore is raised while the tool is attached"
    );
    let (status, lines, err) = tool.stop();
    assert_eq!(status, 0, "{err}");
    let ours = counts_line(&lines);
    assert_eq!(ours, expected_counts(N));

    if let Some(why) = kernel_unavailable() {
        eprintln!("kernel comparison skipped: {why}");
        return;
    }
    let kt = s.tmp.join("kernel-usdt_target");
    bpftime_tests::copy_executable(examples::USDT_TARGET, &kt);
    let kt = kt.to_str().unwrap();
    let mut c = Command::new(examples::USDT_COUNT);
    c.args(["--target", kt]);
    let tool = Tool::spawn(c);
    let out = Command::new(kt).arg(N.to_string()).output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        target_line(N, N)
    );
    let (status, lines, err) = tool.stop();
    assert_eq!(status, 0, "{err}");
    assert_eq!(counts_line(&lines), ours, "the kernel counted otherwise");
}

#[test]
fn bpftrace_usdt_with_arguments_and_semaphores_matches_the_kernel() {
    require_bpftrace();
    let s = Session::new("usdt-bpftrace");
    let t = s.target_copy(examples::USDT_TARGET);
    let t = t.to_str().unwrap();
    let script = |t: &str| {
        format!(
            "usdt:{t}:bpftime_test:tick {{ @ticks = count(); @sum = sum(arg1); }} \
             usdt:{t}:bpftime_test:guarded {{ @guarded = count(); @gsum = sum(arg0); }}"
        )
    };
    let lines = |lines: Vec<String>| -> Vec<String> {
        let mut v: Vec<String> = lines.into_iter().filter(|l| l.starts_with('@')).collect();
        v.sort();
        v
    };
    let tick_sum: u64 = (0..N).map(|i| 3 * i).sum();
    let guarded_sum: u64 = (0..N).sum();
    let want = vec![
        format!("@gsum: {guarded_sum}"),
        format!("@guarded: {N}"),
        format!("@sum: {tick_sum}"),
        format!("@ticks: {N}"),
    ];

    let mut c = s.bpftime();
    c.args(["load", "bpftrace", "-e", &script(t)]);
    let tool = Tool::spawn_until(c, "Attaching 2 probes...");
    s.wait_for_links(2);
    std::thread::sleep(Duration::from_secs(2));
    let out = s.start(&[t, &N.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        target_line(N, N)
    );
    let (_, got, err) = tool.stop();
    let ours = lines(got);
    assert_eq!(ours, want, "bpftrace under bpftime: {err}");

    if let Some(why) = kernel_unavailable() {
        eprintln!("kernel comparison skipped: {why}");
        return;
    }
    let kt = s.tmp.join("kernel-usdt_target");
    bpftime_tests::copy_executable(examples::USDT_TARGET, &kt);
    let kt = kt.to_str().unwrap();
    let mut c = Command::new("bpftrace");
    c.args(["-e", &script(kt)]);
    let tool = Tool::spawn_until(c, "Attaching 2 probes...");
    std::thread::sleep(Duration::from_secs(2));
    let out = Command::new(kt).arg(N.to_string()).output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        target_line(N, N)
    );
    let (_, got, err) = tool.stop();
    assert_eq!(
        lines(got),
        ours,
        "the kernel's bpftrace printed otherwise: {err}"
    );
}

/// In a running target: the semaphore goes up when the tool attaches and back down when
/// it exits; the one-byte site gets a breakpoint and the loop head a jump; the code is
/// the file's again afterwards.
#[test]
fn semaphores_and_breakpoints_come_and_go_with_the_tool() {
    let s = Session::new("usdt-live");
    let t = s.target_copy(examples::USDT_TARGET);
    let t = t.to_str().unwrap();
    let mut target_cmd = s.bpftime();
    target_cmd.args(["start", t, "-"]);
    let mut target = Driven::spawn(target_cmd);
    let pid = target.pid();
    let loop_sum = hex_field(&target.wait_for("loop_sum="), "loop_sum");
    let original = code_in_file(pid, loop_sum, 8);
    target.send("100");
    assert_eq!(target.wait_for("total="), target_line(100, 0));

    let tool = s.load(&[examples::USDT_COUNT, "--target", t]);
    wait_until("the agent hooks loop_sum+2 and +3", || {
        let now = code_in_memory(pid, loop_sum, 8);
        now[2] == 0xcc && now[3] == 0xe9
    });
    assert_eq!(
        code_in_memory(pid, loop_sum, 2),
        original[..2],
        "nothing before the probed nop changes"
    );
    target.send("200");
    assert_eq!(
        target.wait_for("total="),
        target_line(300, 200),
        "every step taken while attached saw the semaphore"
    );
    let (status, lines, err) = tool.stop();
    assert_eq!(status, 0, "{err}");
    // Steps 100..300, counted by difference from a hand count over 0..300 and 0..100.
    let c = |l: &str, k: &str| bpftime_tests::field(&[l.to_string()], "", k).unwrap();
    let got = counts_line(&lines);
    let (all, before) = (expected_counts(300), expected_counts(100));
    for k in [
        "ticks",
        "tick_sum",
        "guarded",
        "guarded_sum",
        "nop",
        "head",
        "head_sum",
    ] {
        assert_eq!(c(&got, k), c(&all, k) - c(&before, k), "{k} in `{got}`");
    }

    wait_until("the agent restores loop_sum", || {
        code_in_memory(pid, loop_sum, 8) == original
    });
    target.send("50");
    assert_eq!(
        target.wait_for("total="),
        target_line(350, 200),
        "the semaphore is down once the tool is gone"
    );
    let (status, _, err) = target.finish();
    assert!(status.success(), "target failed: {err}");
}

/// A probe at an offset inside an instruction is refused with the function and the
/// nearest instruction starts named, and the target runs on untouched.
#[test]
fn a_probe_inside_an_instruction_is_refused_by_name() {
    let s = Session::new("usdt-misaligned");
    let t = s.target_copy(examples::USDT_TARGET);
    let t = t.to_str().unwrap();
    // loop_sum+4 is inside `add rax, rdi` (+3..+6); libbpf takes `function+offset` in
    // the section name and attaches it where the section says.
    let obj = s.compile_bpf(
        "mid",
        &format!(
            r#"
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
SEC("uprobe/{t}:loop_sum+4") int mid(void *ctx) {{ return 0; }}
char LICENSE[] SEC("license") = "GPL";
"#
        ),
    );
    let tool = s.load(&[examples::GPU_PROBES, "--obj", obj.to_str().unwrap()]);
    let mut target_cmd = s.bpftime();
    target_cmd
        .args(["start", t, "-"])
        .env("BPFTIME_LOG", "error");
    let mut target = Driven::spawn(target_cmd);
    target.wait_for("loop_sum=");
    target.send("10");
    assert_eq!(target.wait_for("total="), target_line(10, 0));
    let (status, _, err) = target.finish();
    assert!(status.success());
    assert!(
        err.contains("loop_sum+0x4")
            && err.contains("not where an instruction starts")
            && err.contains("loop_sum+0x3 or loop_sum+0x6"),
        "the refusal names the place: {err}"
    );
    drop(tool);
}
