//! Jumps that cover several instructions, written while threads run through them: a thread
//! stopped between two of the covered instructions must not resume in the jump's operand.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bpftime_attach::{
    attach_uprobe, attach_uprobe_code, detach, detour, remove_detour, CodeHandler, HookAddress,
    PtRegs,
};

/// The stress tests take turns: each wants the CPUs for its own threads.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

// Each returns its argument plus one through four one-byte instructions and a three-byte
// one: the jump covers them all, with a boundary at each of offsets 1 to 4. A thread sent
// to the wrong copy pushes twice, pops twice or adds twice, and a thread left inside runs
// the jump's displacement as code; either shows in the result or kills the process.
std::arch::global_asm!(
    ".macro bpftime_test_interior_body name",
    ".p2align 4",
    ".globl \\name",
    "\\name:",
    "push rdi",
    "pop rax",
    "nop",
    "nop",
    "inc rax",
    "ret",
    ".endm",
    ".text",
    "bpftime_test_interior_body bpftime_test_interior_hooked",
    "bpftime_test_interior_body bpftime_test_interior_detoured",
    ".p2align 4",
    ".globl bpftime_test_interior_none",
    "bpftime_test_interior_none:",
    // One 7-byte instruction: nothing inside the jump, so no thread is ever asked to move.
    "lea rax, [rdi + 0x12345678]",
    "ret",
    // Returns its first argument plus one, calling its second (a function) on the way from
    // inside the jump's bytes: the call returns to offset 3.
    ".p2align 4",
    ".globl bpftime_test_interior_calling",
    "bpftime_test_interior_calling:",
    "push rdi",
    "call rsi",
    "pop rax",
    "inc rax",
    "ret",
    // Counts into the word at `arg`.
    ".globl bpftime_test_interior_counting",
    "bpftime_test_interior_counting:",
    "lock inc qword ptr [rsi]",
    "xor eax, eax",
    "ret",
);

extern "C" {
    fn bpftime_test_interior_hooked(x: u64) -> u64;
    fn bpftime_test_interior_detoured(x: u64) -> u64;
    fn bpftime_test_interior_none(x: u64) -> u64;
    fn bpftime_test_interior_calling(x: u64, call: extern "C" fn()) -> u64;
    fn bpftime_test_interior_counting(regs: *mut PtRegs, arg: u64, zero: u64) -> u64;
}

/// The assembly handler counting into `hits`, which it holds.
fn counting_into(hits: &Arc<AtomicU64>) -> CodeHandler {
    CodeHandler {
        entry: bpftime_test_interior_counting,
        arg: Arc::as_ptr(hits) as u64,
        owner: hits.clone(),
        keeps_vector_registers: true,
        regs_read: 0,
    }
}

fn addr(f: *const ()) -> usize {
    f as usize
}

/// The first byte of a function: what the patch left there.
fn first_byte(f: usize) -> u8 {
    // SAFETY: `f` is a function of this binary, mapped readable.
    unsafe { std::ptr::read_volatile(f as *const u8) }
}

/// Stops the callers even when an assertion fails, or the scope would never end.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

const CALLERS: u64 = 4;

/// `CALLERS` threads call `f`, each result checked, while `patch` runs on this thread;
/// answers how many calls they made. Half of them nap between bursts of calls, so that the
/// patcher also finds threads asleep, which it leaves alone.
fn while_callers_run(
    f: unsafe extern "C" fn(u64) -> u64,
    ok: fn(u64, u64) -> bool,
    patch: impl FnOnce(),
) -> u64 {
    let stop = AtomicBool::new(false);
    let calls = AtomicU64::new(0);
    let started = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        for t in 0..CALLERS {
            let (stop, calls, started) = (&stop, &calls, &started);
            s.spawn(move || {
                started.fetch_add(1, Ordering::Relaxed);
                let mut x = t << 40;
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    if t % 2 == 1 {
                        std::thread::sleep(Duration::from_micros(20));
                    }
                    for _ in 0..64 {
                        // SAFETY: the assembly functions above take and return an integer.
                        let r = unsafe { f(black_box(x)) };
                        assert!(ok(x, r), "f({x:#x}) returned {r:#x}");
                        x += 1;
                    }
                    n += 64;
                }
                calls.fetch_add(n, Ordering::Relaxed);
            });
        }
        while started.load(Ordering::Relaxed) < CALLERS as usize {
            std::thread::yield_now();
        }
        patch();
    });
    calls.into_inner()
}

/// A uprobe attached and detached a thousand times while four threads call the function:
/// every call returns what it should, the handler runs no more often than the function is
/// called, and attaches write the jump (one that leaves a breakpoint is as correct, only
/// slower to hit).
#[test]
fn threads_between_covered_instructions_survive_attach_and_detach() {
    let _turn = one_at_a_time();
    let f = addr(bpftime_test_interior_hooked as *const ());
    let original = first_byte(f);
    let hits = Arc::new(AtomicU64::new(0));
    let (mut jumps, mut breakpoints) = (0, 0);
    let rounds = 1000;
    let call = black_box(bpftime_test_interior_hooked as unsafe extern "C" fn(u64) -> u64);
    let calls = while_callers_run(
        call,
        |x, r| r == x + 1,
        || {
            for _ in 0..rounds {
                let handler = counting_into(&hits);
                // SAFETY: a whole assembly function of this binary, entered by call; the
                // handler counts into `hits`, which it holds.
                let id =
                    unsafe { attach_uprobe_code(HookAddress::function_entry(f), handler) }.unwrap();
                match first_byte(f) {
                    0xe9 => jumps += 1,
                    0xcc => breakpoints += 1,
                    b => panic!("the site starts with {b:#x}"),
                }
                std::thread::yield_now();
                detach(id).unwrap();
                assert_eq!(first_byte(f), original, "detached");
            }
        },
    );
    let hits = hits.load(Ordering::Relaxed);
    eprintln!(
        "{rounds} attaches: {jumps} jumps, {breakpoints} breakpoints; {calls} calls, {hits} hits"
    );
    assert!(hits <= calls, "{hits} hits for {calls} calls");
    assert!(hits > 0, "the hook saw calls");
    assert!(jumps > 0, "some attach wrote the jump");
}

static IN_CALLEE: AtomicBool = AtomicBool::new(false);
static RELEASE: AtomicBool = AtomicBool::new(false);

extern "C" fn wait_for_release() {
    IN_CALLEE.store(true, Ordering::SeqCst);
    while !RELEASE.load(Ordering::SeqCst) {
        std::hint::spin_loop();
    }
}

extern "C" fn nothing() {}

/// A thread inside a function called from between the covered instructions, when the
/// uprobe is attached, returns between them: no look at the threads finds it there (it
/// is in the callee), so the site stays a breakpoint, and it comes back to the original
/// bytes. A jump would have it run the jump's displacement as code.
#[test]
fn a_call_among_the_covered_instructions_returns_to_them_safely() {
    let _turn = one_at_a_time();
    let f = addr(bpftime_test_interior_calling as *const ());
    let original = first_byte(f);
    std::thread::scope(|s| {
        // SAFETY: the assembly function calls its second argument and returns an integer.
        let inside = s.spawn(|| unsafe { bpftime_test_interior_calling(41, wait_for_release) });
        while !IN_CALLEE.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        let hits = Arc::new(AtomicU64::new(0));
        let handler = counting_into(&hits);
        // SAFETY: a whole assembly function of this binary, entered by call; the handler
        // counts into `hits`, which it holds.
        let id = unsafe { attach_uprobe_code(HookAddress::function_entry(f), handler) }.unwrap();
        let head = first_byte(f);
        RELEASE.store(true, Ordering::SeqCst);
        assert_eq!(inside.join().unwrap(), 42, "the call in flight came back");
        assert_eq!(
            head, 0xcc,
            "a call among the covered bytes keeps the site a breakpoint"
        );
        // SAFETY: as above.
        assert_eq!(unsafe { bpftime_test_interior_calling(1, nothing) }, 2);
        assert_eq!(hits.load(Ordering::Relaxed), 1, "a later call is seen");
        detach(id).unwrap();
        assert_eq!(first_byte(f), original);
    });
}

static ORIGINAL: AtomicUsize = AtomicUsize::new(0);

extern "C" fn replacement(x: u64) -> u64 {
    // SAFETY: ORIGINAL holds `Detour::original` of the detoured function, same signature.
    let original: extern "C" fn(u64) -> u64 =
        unsafe { std::mem::transmute(ORIGINAL.load(Ordering::Acquire)) };
    original(x) + 1000
}

/// The same for a detour, which writes its jump the same way.
#[test]
fn threads_between_covered_instructions_survive_a_detour_coming_and_going() {
    let _turn = one_at_a_time();
    let f = addr(bpftime_test_interior_detoured as *const ());
    let original = first_byte(f);
    let (mut jumps, mut breakpoints) = (0, 0);
    let rounds = 300;
    let call = black_box(bpftime_test_interior_detoured as unsafe extern "C" fn(u64) -> u64);
    let calls = while_callers_run(
        call,
        |x, r| r == x + 1 || r == x + 1001,
        || {
            for _ in 0..rounds {
                // SAFETY: a whole assembly function of this binary that nothing jumps into;
                // the replacement has its signature and stays mapped.
                let d = unsafe { detour(f, replacement as *const () as usize, &ORIGINAL) }.unwrap();
                match first_byte(f) {
                    0xe9 => jumps += 1,
                    0xcc => breakpoints += 1,
                    b => panic!("the site starts with {b:#x}"),
                }
                std::thread::sleep(Duration::from_micros(100));
                remove_detour(d).unwrap();
                assert_eq!(first_byte(f), original, "removed");
            }
        },
    );
    eprintln!("{rounds} detours: {jumps} jumps, {breakpoints} breakpoints; {calls} calls");
    assert!(jumps > 0, "some detour wrote the jump");
}

/// How long one attach takes with n other threads spinning, asleep, or none, at a site with
/// boundaries inside the jump (the threads are asked) and at one without (they are not).
/// Run with `--ignored --nocapture`.
#[test]
#[ignore = "a measurement: prints attach latencies"]
fn attach_latency() {
    let _turn = one_at_a_time();
    let sites = [
        (
            "4 boundaries inside",
            addr(bpftime_test_interior_hooked as *const ()),
        ),
        ("none inside", addr(bpftime_test_interior_none as *const ())),
    ];
    // SAFETY: plain assembly taking and returning an integer.
    assert_eq!(unsafe { bpftime_test_interior_none(1) }, 0x12345679);
    let threads = std::env::var("ATTACH_LATENCY_THREADS")
        .ok()
        .and_then(|v| {
            v.split(',')
                .map(|n| n.parse().ok())
                .collect::<Option<Vec<usize>>>()
        })
        .unwrap_or_else(|| vec![0, 1, 2, 4, 8]);
    let noop: bpftime_attach::Handler = Arc::new(|_| {});
    for (what, f) in sites {
        for &n in &threads {
            for spinning in [true, false] {
                if n == 0 && !spinning {
                    continue;
                }
                let stop = AtomicBool::new(false);
                let mut times = Vec::new();
                let mut breakpoints = 0;
                std::thread::scope(|s| {
                    let _stop = StopOnDrop(&stop);
                    for _ in 0..n {
                        let stop = &stop;
                        s.spawn(move || {
                            while !stop.load(Ordering::Relaxed) {
                                if spinning {
                                    std::hint::spin_loop();
                                } else {
                                    std::thread::sleep(Duration::from_millis(50));
                                }
                            }
                        });
                    }
                    std::thread::sleep(Duration::from_millis(20));
                    for _ in 0..200 {
                        let t = Instant::now();
                        // SAFETY: whole assembly functions of this binary, entered by call.
                        let id =
                            unsafe { attach_uprobe(HookAddress::function_entry(f), noop.clone()) }
                                .unwrap();
                        times.push(t.elapsed());
                        breakpoints += usize::from(first_byte(f) == 0xcc);
                        detach(id).unwrap();
                    }
                });
                times.sort();
                let pct = |p: usize| times[(times.len() - 1) * p / 100].as_secs_f64() * 1e6;
                println!(
                    "{what:>20}, {n} threads {:>8}: median {:8.1} us, p90 {:8.1} us, max {:8.1} us, {breakpoints} breakpoints",
                    if spinning { "spinning" } else { "asleep" },
                    pct(50),
                    pct(90),
                    pct(100),
                );
            }
        }
    }
}
