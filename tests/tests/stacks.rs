//! User stacks: `bpf_get_stackid` into stack trace maps and `bpf_get_stack`,
//! at a uprobe and a uretprobe, under bpftime and on the kernel. The target is
//! built without PIE and with frame pointers, so both see the same addresses,
//! and stack ids (a hash of the frames) must agree too. With uretprobes pending
//! on callers further up the chain, both show the callers' real return
//! addresses where the uretprobes' trampolines stand on the stack.

mod support;

use bpftime_isa::uapi::{cmd, map_type};
use bpftime_runtime::Store;
use bpftime_shim::Shim;
use bpftime_tests::bpf::{put32, put64, Bpf, Kernel, Ours, Res};
use bpftime_tests::{examples, function_symbols, kernel_unavailable, Session, Tool};
use std::collections::HashMap;
use std::process::Command;

const N: u32 = 3;

/// The function each frame falls in (`?` for none of the target's).
fn symbolize(syms: &HashMap<String, (u64, u64)>, frames: &str) -> Vec<String> {
    frames
        .split(',')
        .filter(|f| !f.is_empty())
        .map(|f| {
            let a = u64::from_str_radix(f.trim_start_matches("0x"), 16).unwrap();
            syms.iter()
                .find(|(_, &(start, size))| a >= start && a < start + size)
                .map_or("?".to_string(), |(n, _)| n.clone())
        })
        .collect()
}

fn value<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in {line}"))
}

/// The `stacks` tool's arguments: `leaf` probed, a uretprobe on each of `outer`.
fn tool_args<'a>(target: &'a str, outer: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["--target", target, "--func", "leaf"];
    for o in outer {
        args.extend(["--outer", o]);
    }
    args
}

fn run_under_bpftime(s: &Session, target: &str, outer: &[&str]) -> Vec<String> {
    run_under_bpftime_priming(s, target, outer, None)
}

/// [`run_under_bpftime`], the target's hijacked returns primed or not as `prime` says
/// (`BPFTIME_PRIME_RETURNS`), or as its CPU decides.
fn run_under_bpftime_priming(
    s: &Session,
    target: &str,
    outer: &[&str],
    prime: Option<bool>,
) -> Vec<String> {
    let mut tool = vec![examples::STACKS];
    tool.extend(tool_args(target, outer));
    let tool = s.load(&tool);
    let mut start = s.bpftime();
    start.args(["start", target, &N.to_string()]);
    if let Some(prime) = prime {
        start.env("BPFTIME_PRIME_RETURNS", if prime { "1" } else { "0" });
    }
    let out = bpftime_tests::run_with_timeout(start, std::time::Duration::from_secs(60));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (code, lines, err) = tool.stop();
    assert_eq!(code, 0, "{err}");
    lines
}

fn run_on_kernel(s: &Session, outer: &[&str]) -> Option<Vec<String>> {
    if let Some(why) = kernel_unavailable() {
        eprintln!("kernel comparison skipped: {why}");
        return None;
    }
    let dir = s.tmp.join("kernel");
    std::fs::create_dir_all(&dir).unwrap();
    let t = dir.join("stack_target");
    bpftime_tests::copy_executable(examples::STACK_TARGET, &t);
    let t = t.to_str().unwrap();
    let mut c = Command::new(examples::STACKS);
    c.args(tool_args(t, outer));
    let tool = Tool::spawn(c);
    assert!(Command::new(t)
        .arg(N.to_string())
        .status()
        .unwrap()
        .success());
    let (code, lines, err) = tool.stop();
    assert_eq!(code, 0, "{err}");
    Some(lines)
}

/// What every line of the `stacks` tool must say for `stack_target N`, and
/// the helper answers (what, ret, count) it printed.
fn check_stacks(ours: &[String], t: &str) -> Vec<(u32, i32, u32)> {
    let syms = function_symbols(t);
    let chain = |path: &str| ["leaf", "mid", path, "drive", "main"].map(String::from);

    let entries: Vec<&String> = ours.iter().filter(|l| l.starts_with("entry ")).collect();
    let returns: Vec<&String> = ours.iter().filter(|l| l.starts_with("return ")).collect();
    assert_eq!(entries.len(), 2 * N as usize, "{ours:#?}");
    assert_eq!(returns.len(), 2 * N as usize, "{ours:#?}");
    for (i, e) in entries.iter().enumerate() {
        let path = if (i as u32) < N { "top_a" } else { "top_b" };
        let want = chain(path);
        assert_eq!(value(e, "arg"), i.to_string());
        assert_eq!(value(e, "len"), "32", "{e}");
        // At the entry: the probed address itself, then every caller.
        let frames = value(e, "frames");
        assert!(
            frames.starts_with(&format!("{:#x},", syms["leaf"].0)),
            "{e}"
        );
        assert_eq!(symbolize(&syms, frames), want[..4], "{e}");
        assert_eq!(value(e, "skip1_len"), "24", "{e}");
        assert_eq!(symbolize(&syms, value(e, "skip1")), want[1..4], "{e}");
    }
    for (i, r) in returns.iter().enumerate() {
        let path = if (i as u32) < N { "top_a" } else { "top_b" };
        // At the return: the return address in the caller first.
        assert_eq!(value(r, "len"), "32", "{r}");
        assert_eq!(
            symbolize(&syms, value(r, "frames")),
            chain(path)[1..5],
            "{r}"
        );
        assert_eq!(
            symbolize(&syms, value(r, "skip1")),
            chain(path)[2..5],
            "{r}"
        );
    }

    // Two call chains, so two ids in the big map, each hit N times; the
    // one-entry maps answer EEXIST, and ENOMEM even with REUSE_STACKID (the
    // replacement needs a free element first).
    let results: Vec<(u32, i32, u32)> = ours
        .iter()
        .filter(|l| l.starts_with("result "))
        .map(|l| {
            (
                value(l, "what").parse().unwrap(),
                value(l, "ret").parse().unwrap(),
                value(l, "count").parse().unwrap(),
            )
        })
        .collect();
    let of = |what: u32| -> Vec<(i32, u32)> {
        results
            .iter()
            .filter(|r| r.0 == what)
            .map(|r| (r.1, r.2))
            .collect()
    };
    let ids = of(0);
    assert_eq!(ids.len(), 2, "{results:?}");
    assert!(ids.iter().all(|&(id, n)| (0..64).contains(&id) && n == N));
    assert_eq!(of(2), vec![(-libc::EEXIST, N), (0, N)]);
    assert_eq!(of(3), vec![(-libc::ENOMEM, N), (0, N)]);
    assert_eq!(
        of(5),
        vec![(-libc::EFAULT, 2 * N)],
        "kernel stack at a uprobe"
    );
    assert_eq!(of(6), vec![(-libc::EINVAL, 2 * N)], "unknown flag");
    assert_eq!(of(7), vec![(0, 2 * N)], "bpf_get_stack of the kernel stack");
    assert_eq!(
        of(8),
        vec![(-libc::EINVAL, 2 * N)],
        "size not a multiple of 8"
    );
    for (id, _) in ids {
        let line = ours
            .iter()
            .find(|l| l.starts_with(&format!("stack map=stacks id={id} ")))
            .unwrap_or_else(|| panic!("stack {id} not in the map: {ours:#?}"));
        let names = symbolize(&syms, value(line, "frames"));
        assert!(
            names == chain("top_a")[..4] || names == chain("top_b")[..4],
            "{line}"
        );
    }
    results
}

#[test]
fn user_stacks_symbolize_to_the_call_chain_and_match_the_kernel() {
    let s = Session::new("stacks");
    let t = s.target_copy(examples::STACK_TARGET);
    let t = t.to_str().unwrap();
    let ours = run_under_bpftime(&s, t, &[]);
    let results = check_stacks(&ours, t);
    assert!(results.iter().all(|r| r.0 != 9), "no --outer: {results:?}");
    if let Some(kernel) = run_on_kernel(&s, &[]) {
        assert_eq!(kernel, ours, "same frames, ids and answers as the kernel");
    }
}

/// `mid` and `drive` have uretprobes too: at leaf's uprobe and uretprobe,
/// their return addresses on the stack are trampolines, and every frame must
/// still name the real caller (the same frames, and so the same stack ids, as
/// with no uretprobe pending), as on the kernel.
#[test]
fn user_stacks_through_pending_uretprobes_show_the_real_callers_as_the_kernel_does() {
    let s = Session::new("stacks-nested");
    let t = s.target_copy(examples::STACK_TARGET);
    let t = t.to_str().unwrap();
    let outer = ["mid", "drive"];
    let plain = run_under_bpftime(&s, t, &[]);
    let kernel = run_on_kernel(&s, &outer);
    // Return addresses replaced by the return stub, and by each site's landing where
    // the trampoline primes the return (Intel CPUs by default).
    for prime in [false, true] {
        let ours = run_under_bpftime_priming(&s, t, &outer, Some(prime));
        let results = check_stacks(&ours, t);
        let outer_returns: Vec<_> = results.iter().filter(|r| r.0 == 9).collect();
        assert_eq!(
            outer_returns,
            vec![&(9, 0, 2 * N * outer.len() as u32)],
            "every return of mid and drive (primed: {prime})"
        );
        let without_outer: Vec<&String> = ours
            .iter()
            .filter(|l| !l.starts_with("result what=9 "))
            .collect();
        assert_eq!(
            without_outer,
            plain.iter().collect::<Vec<_>>(),
            "pending uretprobes change no frame and no stack id (primed: {prime})"
        );
        if let Some(kernel) = &kernel {
            assert_eq!(
                kernel, &ours,
                "same frames, ids and answers as the kernel (primed: {prime})"
            );
        }
    }
}

// ----- stack trace maps through bpf(), against the kernel -----

fn create(bpf: &mut dyn Bpf, key: u32, value: u32, max: u32, flags: u32) -> Res {
    let mut a = [0u8; 128];
    put32(&mut a, 0, map_type::STACK_TRACE);
    put32(&mut a, 4, key);
    put32(&mut a, 8, value);
    put32(&mut a, 12, max);
    put32(&mut a, 16, flags);
    bpf.call(cmd::MAP_CREATE, &mut a)
}

fn elem(bpf: &mut dyn Bpf, command: u32, fd: i64, key: Option<u32>, out: &mut [u8]) -> Res {
    let k = key.map(u32::to_ne_bytes);
    let mut a = [0u8; 128];
    put32(&mut a, 0, fd as u32);
    put64(&mut a, 8, k.as_ref().map_or(0, |k| k.as_ptr() as u64));
    // The kernel wants fields a command does not use zeroed (a delete has no value).
    if command != cmd::MAP_DELETE_ELEM {
        put64(&mut a, 16, out.as_mut_ptr() as u64);
    }
    bpf.call(command, &mut a)
}

/// What every step answered: creation succeeds or fails alike, and on an
/// empty map every element command fails alike (a stack trace map is filled
/// only by programs; the test above covers filled maps).
fn stack_map_script(bpf: &mut dyn Bpf) -> Vec<(String, Res)> {
    let mut log = Vec::new();
    for (k, v, max, flags) in [
        (4, 64, 16, 0),
        (4, 12, 16, 0),
        (4, 4, 16, 0),
        (8, 64, 16, 0),
        (4, 64, 0, 0),
        (4, 8 * 127, 4, 0),
        (4, 8 * 128, 4, 0),
        (4, 64, 16, 1 << 3),
        (4, 64, 16, 1 << 10),
    ] {
        let r = create(bpf, k, v, max, flags).map(|_| 0);
        log.push((
            format!("create key {k} value {v} max {max} flags {flags:#x}"),
            r,
        ));
    }
    let fd = create(bpf, 4, 32, 5, 0).expect("create a stack trace map");
    let mut v = [0u8; 32];
    let mut next = [0u8; 4];
    for (what, command, key) in [
        ("lookup 0", cmd::MAP_LOOKUP_ELEM, Some(0)),
        ("lookup 7 (last bucket)", cmd::MAP_LOOKUP_ELEM, Some(7)),
        ("lookup 8 (past the buckets)", cmd::MAP_LOOKUP_ELEM, Some(8)),
        ("delete 0", cmd::MAP_DELETE_ELEM, Some(0)),
        ("delete 8 (past the buckets)", cmd::MAP_DELETE_ELEM, Some(8)),
        ("update 0", cmd::MAP_UPDATE_ELEM, Some(0)),
        (
            "lookup-and-delete 0",
            cmd::MAP_LOOKUP_AND_DELETE_ELEM,
            Some(0),
        ),
    ] {
        log.push((what.to_string(), elem(bpf, command, fd, key, &mut v)));
    }
    log.push((
        "next key of none".into(),
        elem(bpf, cmd::MAP_GET_NEXT_KEY, fd, None, &mut next),
    ));
    log.push((
        "next key of 3".into(),
        elem(bpf, cmd::MAP_GET_NEXT_KEY, fd, Some(3), &mut next),
    ));
    log
}

#[test]
fn stack_trace_map_commands_agree_with_the_kernel() {
    let name = format!("test-stackmap-{}", std::process::id());
    let store = Store::create_or_open(&name).unwrap();
    let mut ours = Ours(Shim::new(store));
    let got = stack_map_script(&mut ours);
    let _ = Store::open(&name).map(|s| s.destroy());
    let find = |what: &str| got.iter().find(|(w, _)| w.starts_with(what)).unwrap().1;
    assert_eq!(find("create key 4 value 64 max 16 flags 0x0"), Ok(0));
    assert_eq!(find("create key 4 value 1024"), Err(libc::EINVAL));
    assert_eq!(find("lookup 0"), Err(libc::ENOENT));
    assert_eq!(find("delete 8"), Err(libc::E2BIG));
    assert_eq!(find("lookup-and-delete 0"), Err(libc::ENOENT));
    assert_eq!(find("update 0"), Err(libc::EINVAL));
    if let Some(why) = kernel_unavailable() {
        eprintln!("kernel comparison skipped: {why}");
        return;
    }
    let kernel = stack_map_script(&mut Kernel);
    assert_eq!(got, kernel);
}
