//! bpftrace (Debian's 0.17) under `bpftime load`: one-liners print what they
//! print on the kernel.

use bpftime_tests::{examples, kernel_unavailable, Session, Tool};
use std::process::Command;
use std::time::Duration;

const N: u64 = 200;

fn have_bpftrace() -> bool {
    Command::new("bpftrace")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn ours(s: &Session, script: &str, target: &str, last: Option<&str>) -> Vec<String> {
    let mut c = s.bpftime();
    c.args(["load", "bpftrace", "-e", script]);
    let mut tool = Tool::spawn_until(c, "Attaching 1 probe...");
    s.wait_for_links(1);
    // bpftrace prints no line once it is ready; a SIGINT in the last part of its
    // start-up is lost (on the kernel too), so give it the time the kernel run gets.
    std::thread::sleep(Duration::from_secs(2));
    let out = s.start(&[target, &N.to_string()]);
    assert!(out.status.success());
    // Printed events arrive through the perf buffer; let the last one in, as a
    // user waits to see it before pressing Ctrl-C.
    if let Some(l) = last {
        tool.wait_for_line(l, Duration::from_secs(10));
    }
    let (_, lines, _) = tool.stop();
    lines
}

fn kernel(script: &str, target: &str, last: Option<&str>) -> Option<Vec<String>> {
    if let Some(why) = kernel_unavailable() {
        eprintln!("kernel comparison skipped: {why}");
        return None;
    }
    let mut c = Command::new("bpftrace");
    c.args(["-e", script]);
    let tool = Tool::spawn_until(c, "Attaching 1 probe...");
    std::thread::sleep(Duration::from_secs(2));
    let mut tool = tool;
    assert!(Command::new(target)
        .arg(N.to_string())
        .status()
        .unwrap()
        .success());
    if let Some(l) = last {
        tool.wait_for_line(l, Duration::from_secs(10));
    }
    let (_, lines, _) = tool.stop();
    Some(lines)
}

fn nonempty(lines: Vec<String>) -> Vec<String> {
    lines
        .into_iter()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("Attaching"))
        .collect()
}

#[test]
fn count_and_printf_one_liners_match_the_kernel() {
    if !have_bpftrace() {
        panic!("bpftrace is not installed: run scripts/setup.sh (Debian package bpftrace)");
    }
    let s = Session::new("bpftrace");
    let t = s.target_copy(examples::CALLS);
    let t = t.to_str().unwrap();
    let count = format!("uprobe:{t}:work {{ @c = count(); }}");
    let got = nonempty(ours(&s, &count, t, None));
    assert_eq!(got, vec![format!("@c: {N}")]);
    let printf = format!("uprobe:{t}:work {{ printf(\"arg=%d\\n\", arg0); }}");
    let got_printf = nonempty(ours(&s, &printf, t, Some(&format!("arg={}", N - 1))));
    let want: Vec<String> = (0..N).map(|i| format!("arg={i}")).collect();
    assert_eq!(got_printf, want);
    let keyed = format!("uprobe:{t}:work /arg0 < 5/ {{ @[arg0] = count(); }}");
    let got_keyed = nonempty(ours(&s, &keyed, t, None));
    let kt = s.tmp.join("kernel-calls");
    std::fs::copy(examples::CALLS, &kt).unwrap();
    let kt = kt.to_str().unwrap();
    if let Some(k) = kernel(&count.replace(t, kt), kt, None) {
        assert_eq!(nonempty(k), got);
    }
    if let Some(k) = kernel(&printf.replace(t, kt), kt, Some(&format!("arg={}", N - 1))) {
        assert_eq!(nonempty(k), got_printf);
    }
    // bpftrace prints equal counts in hash order, which is the map's own: compare as sets.
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    assert_eq!(
        sorted(got_keyed.clone()),
        (0..5).map(|i| format!("@[{i}]: 1")).collect::<Vec<_>>()
    );
    if let Some(k) = kernel(&keyed.replace(t, kt), kt, None) {
        assert_eq!(sorted(nonempty(k)), sorted(got_keyed));
    }
}
