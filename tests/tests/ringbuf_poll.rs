//! A libbpf tool that reads its ring buffer only with `ring_buffer__poll`, against a
//! target calling the probed function in a tight loop. A test binary of its own: its
//! target keeps both cores busy, which other tests' timings should not share.

use bpftime_tests::{examples, field, Session, Tool};

/// A loader that only polls (`ring_buffer__poll(rb, 100)` until SIGINT, then once more
/// with timeout 0, no `ring_buffer__consume`) gets every record of a sparse stream from
/// a tight loop (one call in 1000 of bench_calls' 11 x 200000), round after round, none
/// dropped: the kernel's ring is readable whenever it holds data, and ours must be too,
/// whatever became of the wake-ups of records committed while the consumer was
/// draining earlier ones (issue 13 saw 3 to 35 of 2000 arrive).
#[test]
fn a_loader_that_only_polls_gets_every_event() {
    const CALLS: u64 = 200_000;
    // bench_calls makes 11 timed rounds of CALLS calls; one call in 1000 is an event.
    const EVENTS: u64 = 11 * CALLS / 1000;
    for round in 0..5 {
        let s = Session::new(&format!("ringpoll{round}"));
        let t = s.target_copy(examples::BENCH_CALLS);
        let t = t.to_str().unwrap();
        let mut c = s.bpftime();
        c.env("RINGBUF_EVENTS_FINAL_POLL", "1").arg("load").args([
            examples::RINGBUF_EVENTS,
            "--obj",
            examples::RINGBUF_SPARSE_BPF_O,
            "--target",
            t,
            "--func",
            "work",
        ]);
        let loader = Tool::spawn(c);
        let out = s.start(&[t, &CALLS.to_string()]);
        assert!(out.status.success(), "target failed: {out:?}");
        let (code, lines, err) = loader.stop();
        assert_eq!(code, 0, "loader failed: {err}");
        let events = field(&lines, "events=", "events").unwrap_or(0);
        let dropped = field(&lines, "dropped=", "dropped").unwrap_or(0);
        assert_eq!(
            (events, dropped),
            (EVENTS, 0),
            "round {round}: events and drops of {EVENTS} records"
        );
    }
}
