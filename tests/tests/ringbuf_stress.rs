//! Ring buffer records from producers on several threads and several processes at
//! full JIT speed, read by an unmodified libbpf C loader waiting the three ways tools
//! wait (`ring_buffer__poll`, `epoll_wait` on `ring_buffer__epoll_fd` then
//! `ring_buffer__consume`, and `ring_buffer__consume` alone): every record is delivered
//! or counted as a drop, and each thread's records arrive in the order it made them.
//! The kernel runs the same scenario as the oracle where it can. A test binary of its
//! own: the producers keep every core busy.

use bpftime_tests::{examples, field, kernel_unavailable, Session, Tool};
use std::process::Command;

/// Calls of work() per producer thread; every call is a record (ringbuf_events.bpf.o,
/// a 256 KiB ring), so a printing consumer falls behind and some are dropped.
const CALLS: u64 = 5000;
const THREADS: u64 = 4;
/// Rounds per consumer mode: a loss in one run of ten fails a mode's rounds with
/// probability 1 - 0.9^20 = 88%, and the test's three modes with 99.8%.
const ROUNDS: usize = 20;

struct Tally {
    events: u64,
    dropped: u64,
    disorder: u64,
}

fn tally(lines: &[String], err: &str) -> Tally {
    let get = |k: &str| {
        field(lines, &format!("{k}="), k).unwrap_or_else(|| panic!("no {k}= line: {err}"))
    };
    Tally {
        events: get("events"),
        dropped: get("dropped"),
        disorder: get("disorder"),
    }
}

/// The loader's arguments: its own program on work() of `target`.
fn loader_args(target: &str) -> [&str; 6] {
    [
        "--obj",
        examples::RINGBUF_EVENTS_BPF_O,
        "--target",
        target,
        "--func",
        "work",
    ]
}

/// Sets the consumer's mode. A loader that waits for readiness (poll, epoll) also
/// drains at the end the way such tools do, with one more `ring_buffer__poll(rb, 0)`:
/// it finds what is left only if the ring says it is readable, which the kernel's
/// always does while it holds records (the lost wake-ups of issue 13 failed here).
fn final_drain<'c>(c: &'c mut Command, mode: &str) -> &'c mut Command {
    c.env("RINGBUF_EVENTS_MODE", mode);
    if mode != "consume" {
        c.env("RINGBUF_EVENTS_FINAL_POLL", "1");
    }
    c
}

fn check(what: &str, t: &Tally, expected: u64) {
    assert_eq!(
        t.events + t.dropped,
        expected,
        "{what}: {} delivered + {} dropped of {expected} records",
        t.events,
        t.dropped
    );
    assert_eq!(t.disorder, 0, "{what}: records out of their thread's order");
    assert!(t.events > 0, "{what}: nothing delivered");
}

#[test]
fn every_record_of_threaded_producers_is_delivered_or_counted_as_dropped() {
    let threads = THREADS.to_string();
    let calls = CALLS.to_string();
    for mode in ["poll", "epoll", "consume"] {
        let (mut delivered, mut dropped) = (0, 0);
        for round in 0..ROUNDS {
            let s = Session::new(&format!("ringstress-{mode}{round}"));
            let t = s.target_copy(examples::CALLS);
            let t = t.to_str().unwrap();
            let mut c = s.bpftime();
            final_drain(&mut c, mode)
                .args(["load", examples::RINGBUF_EVENTS])
                .args(loader_args(t));
            let tool = Tool::spawn(c);
            // Every third round, two processes produce at once.
            let processes = if round % 3 == 2 { 2 } else { 1 };
            std::thread::scope(|scope| {
                let runs: Vec<_> = (0..processes)
                    .map(|_| scope.spawn(|| s.start(&[t, &calls, "--threads", &threads])))
                    .collect();
                for r in runs {
                    let out = r.join().expect("target thread");
                    assert!(out.status.success(), "target failed: {out:?}");
                }
            });
            let (code, lines, err) = tool.stop();
            assert_eq!(code, 0, "loader failed: {err}");
            let got = tally(&lines, &err);
            let expected = CALLS * THREADS * processes;
            check(&format!("{mode}, round {round}"), &got, expected);
            delivered += got.events;
            dropped += got.dropped;
        }
        eprintln!("{mode}: {ROUNDS} rounds, {delivered} records delivered, {dropped} dropped");
    }
}

/// The same scenario on the kernel: the oracle for what a tool gets.
#[test]
fn the_kernel_delivers_or_counts_every_record_of_the_same_scenario() {
    if let Some(why) = kernel_unavailable() {
        eprintln!("kernel comparison skipped: {why}");
        return;
    }
    let s = Session::new("ringstress-kernel");
    let t = s.target_copy(examples::CALLS);
    let t = t.to_str().unwrap();
    for mode in ["poll", "epoll", "consume"] {
        let mut c = Command::new(examples::RINGBUF_EVENTS);
        final_drain(&mut c, mode).args(loader_args(t));
        let tool = Tool::spawn(c);
        let out = Command::new(t)
            .args([&CALLS.to_string(), "--threads", &THREADS.to_string()])
            .output()
            .unwrap();
        assert!(out.status.success(), "target failed: {out:?}");
        let (code, lines, err) = tool.stop();
        assert_eq!(code, 0, "kernel loader failed: {err}");
        check(
            &format!("kernel, {mode}"),
            &tally(&lines, &err),
            CALLS * THREADS,
        );
    }
}
