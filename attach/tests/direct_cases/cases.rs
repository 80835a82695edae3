// The tests of `direct.rs` and `direct_primed.rs`, included by both.

#[path = "../common/mod.rs"]
mod common;
use common::CMP_CASES;

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};

use bpftime_attach::{
    attach_uprobe, attach_uprobe_code, attach_uretprobe, attach_uretprobe_code, detach,
    never_run_handlers_on_this_thread, prime_returns, use_static_tls_flag, use_static_tls_shadow,
    AttachError, CodeHandler, Handler, HookAddress, HookId, PtRegs,
};

// The flag byte, in this executable's static TLS, as the agent's starter library has one,
// and the word that finds each thread's shadow stack.
bpftime_attach::static_tls_flag!(fn flag_offset, "bpftime_test_hook_flag");
bpftime_attach::static_tls_flag!(fn shadow_offset, "bpftime_test_hook_shadow");

/// Tests that hook the same functions (`counted`, `bpftime_test_leaf`, `flagged`) take
/// turns: two handlers at one site would be neither test's lone handler.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Every test calls this first. The sites these tests make prime their hijacked returns
/// as `PRIME_RETURNS` says, whatever the CPU.
fn with_flag() {
    static SET: Once = Once::new();
    SET.call_once(|| {
        prime_returns(Some(PRIME_RETURNS));
        // SAFETY: the byte above is ours alone, zero in every thread, and this runs before
        // the first hook of this process (every test calls it first).
        unsafe { use_static_tls_flag(flag_offset()) }.unwrap();
        // SAFETY: the same, for the 8 bytes of the second.
        unsafe { use_static_tls_shadow(shadow_offset()) }.unwrap();
    });
}

// Handlers in assembly, so what they touch is exactly what is written: `counting` and
// `add_first_argument` leave every vector register alone; `clobbering` counts, then
// overwrites xmm0-15 and every scratch general register, as any C function may.
std::arch::global_asm!(
    ".text",
    ".globl bpftime_test_counting",
    "bpftime_test_counting:",
    "lock inc qword ptr [rsi]",
    "xor eax, eax",
    "ret",
    // Adds the hooked function's return value (PtRegs::ax) to the word at `arg`.
    ".globl bpftime_test_add_return_value",
    "bpftime_test_add_return_value:",
    "mov rax, [rdi + 80]",
    "lock add [rsi], rax",
    "xor eax, eax",
    "ret",
    ".globl bpftime_test_add_first_argument",
    "bpftime_test_add_first_argument:",
    "mov rax, [rdi + 112]",
    "lock add [rsi], rax",
    "xor eax, eax",
    "ret",
    ".globl bpftime_test_record_flags",
    "bpftime_test_record_flags:",
    "mov rax, [rdi + 144]",
    "mov [rsi], rax",
    "xor eax, eax",
    "ret",
    ".globl bpftime_test_clobbering",
    "bpftime_test_clobbering:",
    "lock inc qword ptr [rsi]",
    "pcmpeqd xmm0, xmm0",
    "pcmpeqd xmm1, xmm1",
    "pcmpeqd xmm2, xmm2",
    "pcmpeqd xmm3, xmm3",
    "pcmpeqd xmm4, xmm4",
    "pcmpeqd xmm5, xmm5",
    "pcmpeqd xmm6, xmm6",
    "pcmpeqd xmm7, xmm7",
    "pcmpeqd xmm8, xmm8",
    "pcmpeqd xmm9, xmm9",
    "pcmpeqd xmm10, xmm10",
    "pcmpeqd xmm11, xmm11",
    "pcmpeqd xmm12, xmm12",
    "pcmpeqd xmm13, xmm13",
    "pcmpeqd xmm14, xmm14",
    "pcmpeqd xmm15, xmm15",
    "mov rcx, -1",
    "mov rdx, -1",
    "mov rsi, -1",
    "mov rdi, -1",
    "mov r8, -1",
    "mov r9, -1",
    "mov r10, -1",
    "mov r11, -1",
    "mov eax, -1",
    "ret",
    // A 5-byte no-op and a return: the smallest function a hook fits.
    ".globl bpftime_test_leaf",
    "bpftime_test_leaf:",
    // `nop dword ptr [rax + rax + 0]` in bytes: the assembler drops a zero displacement,
    // which leaves 4 bytes, and the jump would then cover the `ret` too.
    ".byte 0x0f, 0x1f, 0x44, 0x00, 0x00",
    "ret",
    // Calls the leaf with known values in every scratch register, as a caller compiled with
    // GCC's -fipa-ra may keep them across a call to a local function it knows spares them;
    // returns how many came back changed.
    ".globl bpftime_test_scratch_kept",
    "bpftime_test_scratch_kept:",
    "push rbx",
    "mov rbx, rdi",
    "mov rax, rdi",
    "lea rcx, [rdi + 1]",
    "lea rdx, [rdi + 2]",
    "lea rsi, [rdi + 3]",
    "lea r8, [rdi + 4]",
    "lea r9, [rdi + 5]",
    "lea r10, [rdi + 6]",
    "lea r11, [rdi + 7]",
    "movq xmm8, rdi",
    "movq xmm15, rcx",
    "call bpftime_test_leaf",
    "mov rdi, rbx",
    "xor ebx, ebx",
    "cmp rax, rdi",
    "setne bl",
    "lea rax, [rdi + 1]",
    "cmp rcx, rax",
    "setne al",
    "movzx eax, al",
    "add rbx, rax",
    "lea rax, [rdi + 2]",
    "cmp rdx, rax",
    "setne al",
    "movzx eax, al",
    "add rbx, rax",
    "lea rax, [rdi + 3]",
    "cmp rsi, rax",
    "setne al",
    "movzx eax, al",
    "add rbx, rax",
    "lea rax, [rdi + 4]",
    "cmp r8, rax",
    "setne al",
    "movzx eax, al",
    "add rbx, rax",
    "lea rax, [rdi + 5]",
    "cmp r9, rax",
    "setne al",
    "movzx eax, al",
    "add rbx, rax",
    "lea rax, [rdi + 6]",
    "cmp r10, rax",
    "setne al",
    "movzx eax, al",
    "add rbx, rax",
    "lea rax, [rdi + 7]",
    "cmp r11, rax",
    "setne al",
    "movzx eax, al",
    "add rbx, rax",
    "movq rax, xmm8",
    "cmp rax, rdi",
    "setne al",
    "movzx eax, al",
    "add rbx, rax",
    "movq rax, xmm15",
    "lea rcx, [rdi + 1]",
    "cmp rax, rcx",
    "setne al",
    "movzx eax, al",
    "add rax, rbx",
    "pop rbx",
    "ret",
    // Records the hooked code's ip and sp, as its registers say, at [rsi] and [rsi + 8].
    ".globl bpftime_test_record_ip_sp",
    "bpftime_test_record_ip_sp:",
    "mov rax, [rdi + 128]",
    "mov [rsi], rax",
    "mov rax, [rdi + 152]",
    "mov [rsi + 8], rax",
    "xor eax, eax",
    "ret",
    // Calls the leaf; returns the stack pointer the leaf was entered with.
    ".globl bpftime_test_leaf_sp",
    "bpftime_test_leaf_sp:",
    "sub rsp, 8",
    "lea rax, [rsp - 8]",
    "mov [rsp], rax",
    "call bpftime_test_leaf",
    "mov rax, [rsp]",
    "add rsp, 8",
    "ret",
    // Calls the leaf with known values in every callee-saved register; returns how many
    // came back changed.
    ".globl bpftime_test_callee_saved_kept",
    "bpftime_test_callee_saved_kept:",
    "push rbx",
    "push rbp",
    "push r12",
    "push r13",
    "push r14",
    "push r15",
    "sub rsp, 8",
    "mov [rsp], rdi",
    "mov rbx, rdi",
    "lea rbp, [rdi + 1]",
    "lea r12, [rdi + 2]",
    "lea r13, [rdi + 3]",
    "lea r14, [rdi + 4]",
    "lea r15, [rdi + 5]",
    "call bpftime_test_leaf",
    "mov rdx, [rsp]",
    "xor eax, eax",
    "cmp rbx, rdx",
    "setne cl",
    "movzx ecx, cl",
    "add rax, rcx",
    "lea rsi, [rdx + 1]",
    "cmp rbp, rsi",
    "setne cl",
    "movzx ecx, cl",
    "add rax, rcx",
    "lea rsi, [rdx + 2]",
    "cmp r12, rsi",
    "setne cl",
    "movzx ecx, cl",
    "add rax, rcx",
    "lea rsi, [rdx + 3]",
    "cmp r13, rsi",
    "setne cl",
    "movzx ecx, cl",
    "add rax, rcx",
    "lea rsi, [rdx + 4]",
    "cmp r14, rsi",
    "setne cl",
    "movzx ecx, cl",
    "add rax, rcx",
    "lea rsi, [rdx + 5]",
    "cmp r15, rsi",
    "setne cl",
    "movzx ecx, cl",
    "add rax, rcx",
    "add rsp, 8",
    "pop r15",
    "pop r14",
    "pop r13",
    "pop r12",
    "pop rbp",
    "pop rbx",
    "ret",
    // Returns its first argument with the flags of comparing it to its second live at
    // the return.
    ".globl bpftime_test_cmp_then_return",
    "bpftime_test_cmp_then_return:",
    "mov rax, rdi",
    "cmp rdi, rsi",
    "ret",
    // Compares its first two arguments, then calls the third with the flags of that
    // comparison live at the callee's entry.
    ".globl bpftime_test_cmp_then_call",
    "bpftime_test_cmp_then_call:",
    "sub rsp, 8",
    "cmp rdi, rsi",
    "call rdx",
    "add rsp, 8",
    "ret",
);

type CodeEntry = unsafe extern "C" fn(*mut PtRegs, u64, u64) -> u64;

extern "C" {
    fn bpftime_test_counting(regs: *mut PtRegs, arg: u64, zero: u64) -> u64;
    fn bpftime_test_add_return_value(regs: *mut PtRegs, arg: u64, zero: u64) -> u64;
    fn bpftime_test_add_first_argument(regs: *mut PtRegs, arg: u64, zero: u64) -> u64;
    fn bpftime_test_record_flags(regs: *mut PtRegs, arg: u64, zero: u64) -> u64;
    fn bpftime_test_clobbering(regs: *mut PtRegs, arg: u64, zero: u64) -> u64;
    fn bpftime_test_leaf();
    fn bpftime_test_scratch_kept(x: u64) -> u64;
    fn bpftime_test_cmp_then_call(a: u64, b: u64, f: extern "C" fn());
    fn bpftime_test_cmp_then_return(a: u64, b: u64) -> u64;
    fn bpftime_test_record_ip_sp(regs: *mut PtRegs, arg: u64, zero: u64) -> u64;
    fn bpftime_test_leaf_sp() -> u64;
    fn bpftime_test_callee_saved_kept(x: u64) -> u64;
}

/// The `PtRegs` word of each register or field, as `CodeHandler::regs_read` counts them.
fn word(offset: usize) -> u64 {
    1 << (offset / 8)
}

fn code(entry: CodeEntry, cell: &Arc<AtomicU64>, keeps_vector_registers: bool) -> CodeHandler {
    CodeHandler {
        entry,
        arg: Arc::as_ptr(cell) as u64,
        owner: cell.clone(),
        keeps_vector_registers,
        regs_read: u64::MAX,
    }
}

/// [`code`] that reads only the words `regs_read` of its registers.
fn code_reading(
    entry: CodeEntry,
    cell: &Arc<AtomicU64>,
    keeps_vector_registers: bool,
    regs_read: u64,
) -> CodeHandler {
    CodeHandler {
        regs_read,
        ..code(entry, cell, keeps_vector_registers)
    }
}

fn addr(f: *const ()) -> usize {
    f as usize
}

#[inline(never)]
extern "C" fn counted(x: u64) -> u64 {
    black_box(x).wrapping_mul(3)
}

/// 10000 calls of `counted` from each of four threads at once, each result checked.
fn calls_from_four_threads(call: extern "C" fn(u64) -> u64) {
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for i in 0..10_000 {
                    assert_eq!(call(i), i * 3);
                }
            });
        }
    });
}

#[test]
fn a_lone_code_handler_counts_every_call_from_many_threads() {
    with_flag();
    let _turn = one_at_a_time();
    let count = Arc::new(AtomicU64::new(0));
    let args = Arc::new(AtomicU64::new(0));
    let f = addr(counted as *const ());
    // SAFETY: `counted` is a whole function of this binary, entered by call; the handler
    // is assembly that does not unwind and keeps the vector registers.
    let id = unsafe {
        attach_uprobe_code(
            HookAddress::function_entry(f),
            code(bpftime_test_counting, &count, true),
        )
    }
    .unwrap();
    let call = black_box(counted as extern "C" fn(u64) -> u64);
    calls_from_four_threads(call);
    assert_eq!(count.load(Ordering::SeqCst), 40_000);
    detach(id).unwrap();
    call(1);
    assert_eq!(count.load(Ordering::SeqCst), 40_000, "detached");

    // The same site with another lone handler: it reads the registers.
    // SAFETY: as above.
    let id = unsafe {
        attach_uprobe_code(
            HookAddress::function_entry(f),
            code(bpftime_test_add_first_argument, &args, true),
        )
    }
    .unwrap();
    for i in 1..=100 {
        call(i);
    }
    detach(id).unwrap();
    assert_eq!(args.load(Ordering::SeqCst), 5050);
}

/// A lone handler reading only what the short save fills in (none of r15, r14, rbp,
/// orig_ax, cs, ss) gets that save at a function entry: it counts every call from many
/// threads, reads the argument, the ip and the sp the full save would give, and the
/// hooked code gets back every register it may keep across the call.
#[test]
fn a_lone_handler_reading_few_registers_gets_the_short_save_and_the_same_values() {
    use std::mem::offset_of;
    with_flag();
    let _turn = one_at_a_time();
    let count = Arc::new(AtomicU64::new(0));
    let f = addr(counted as *const ());
    // SAFETY: `counted` is a whole function of this binary, entered by call; the handler
    // is assembly that does not unwind, keeps the vector registers and reads no register.
    let id = unsafe {
        attach_uprobe_code(
            HookAddress::function_entry(f),
            code_reading(bpftime_test_counting, &count, true, 0),
        )
    }
    .unwrap();
    let call = black_box(counted as extern "C" fn(u64) -> u64);
    calls_from_four_threads(call);
    assert_eq!(count.load(Ordering::SeqCst), 40_000);
    detach(id).unwrap();

    let args = Arc::new(AtomicU64::new(0));
    // SAFETY: as above; the handler reads rdi only.
    let id = unsafe {
        attach_uprobe_code(
            HookAddress::function_entry(f),
            code_reading(
                bpftime_test_add_first_argument,
                &args,
                true,
                word(offset_of!(PtRegs, di)),
            ),
        )
    }
    .unwrap();
    for i in 1..=100 {
        call(i);
    }
    detach(id).unwrap();
    assert_eq!(args.load(Ordering::SeqCst), 5050);

    // ip and sp, under the short save and under the full one.
    let leaf = addr(bpftime_test_leaf as *const ());
    let seen = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    for regs_read in [
        word(offset_of!(PtRegs, ip)) | word(offset_of!(PtRegs, sp)),
        u64::MAX,
    ] {
        let handler = CodeHandler {
            entry: bpftime_test_record_ip_sp,
            arg: Arc::as_ptr(&seen) as u64,
            owner: seen.clone(),
            keeps_vector_registers: true,
            regs_read,
        };
        // SAFETY: `bpftime_test_leaf` is a whole function; the handler is assembly that
        // writes two words into `seen`, which it holds.
        let id = unsafe { attach_uprobe_code(HookAddress::function_entry(leaf), handler) }.unwrap();
        // SAFETY: plain assembly returning an integer.
        let sp = unsafe { bpftime_test_leaf_sp() };
        detach(id).unwrap();
        assert_eq!(
            seen[0].load(Ordering::SeqCst),
            leaf as u64,
            "ip, regs_read {regs_read:#x}"
        );
        assert_eq!(
            seen[1].load(Ordering::SeqCst),
            sp,
            "sp, regs_read {regs_read:#x}"
        );
    }

    // Every register a caller may keep across the call comes back: the scratch ones
    // (from a handler that overwrites them and every vector register) and the
    // callee-saved ones, three of which the short save's stub uses itself.
    let clobbers = Arc::new(AtomicU64::new(0));
    // SAFETY: as above; the handler reads no register.
    let id = unsafe {
        attach_uprobe_code(
            HookAddress::function_entry(leaf),
            code_reading(bpftime_test_clobbering, &clobbers, false, 0),
        )
    }
    .unwrap();
    for x in [0u64, 1 << 40, u64::MAX - 16] {
        // SAFETY: plain assembly taking and returning integers.
        assert_eq!(unsafe { bpftime_test_scratch_kept(black_box(x)) }, 0);
        // SAFETY: as above.
        assert_eq!(unsafe { bpftime_test_callee_saved_kept(black_box(x)) }, 0);
    }
    detach(id).unwrap();
    assert_eq!(clobbers.load(Ordering::SeqCst), 6);
}

/// Handlers come and go at a function entry while three threads call it: the site moves
/// between the short save (a lone code handler reading few registers), the full save
/// with a direct call, and the Rust path (two handlers), and every caller gets all its
/// registers back whichever list its call met.
#[test]
fn registers_survive_as_the_save_changes_under_running_callers() {
    with_flag();
    let _turn = one_at_a_time();
    let leaf = addr(bpftime_test_leaf as *const ());
    let stop = AtomicBool::new(false);
    let short_hits = Arc::new(AtomicU64::new(0));
    let full_hits = Arc::new(AtomicU64::new(0));
    let closure_hits = Arc::new(AtomicU64::new(0));
    let pair_hits = Arc::new(AtomicU64::new(0));
    let uretprobe_hits = Arc::new(AtomicU64::new(0));
    let calls = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let (stop, calls) = (&stop, &calls);
            s.spawn(move || {
                let mut x = t << 32;
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: plain assembly taking and returning integers.
                    unsafe {
                        assert_eq!(
                            bpftime_test_scratch_kept(black_box(x)),
                            0,
                            "scratch, {x:#x}"
                        );
                        assert_eq!(
                            bpftime_test_callee_saved_kept(black_box(x)),
                            0,
                            "callee-saved, {x:#x}"
                        );
                    }
                    x += 1;
                    calls.fetch_add(2, Ordering::Relaxed);
                }
            });
        }
        for round in 0..500 {
            let c = closure_hits.clone();
            let closure: Handler = Arc::new(move |_| {
                c.fetch_add(1, Ordering::Relaxed);
            });
            // SAFETY: `bpftime_test_leaf` is a whole function; the code handler is
            // assembly that overwrites every scratch and vector register and reads none.
            let ids = unsafe {
                match round % 5 {
                    0 => vec![attach_uprobe_code(
                        HookAddress::function_entry(leaf),
                        code_reading(bpftime_test_clobbering, &short_hits, false, 0),
                    )
                    .unwrap()],
                    1 => vec![attach_uprobe_code(
                        HookAddress::function_entry(leaf),
                        code(bpftime_test_clobbering, &full_hits, false),
                    )
                    .unwrap()],
                    2 => vec![
                        attach_uprobe_code(
                            HookAddress::function_entry(leaf),
                            code_reading(bpftime_test_clobbering, &short_hits, false, 0),
                        )
                        .unwrap(),
                        attach_uprobe(HookAddress::function_entry(leaf), closure).unwrap(),
                    ],
                    // A code pair (the stubs run it), and a uretprobe of code alone.
                    3 => vec![
                        attach_uprobe_code(
                            HookAddress::function_entry(leaf),
                            code_reading(bpftime_test_clobbering, &pair_hits, false, 0),
                        )
                        .unwrap(),
                        attach_uretprobe_code(
                            leaf,
                            code_reading(bpftime_test_clobbering, &pair_hits, false, 0),
                        )
                        .unwrap(),
                    ],
                    _ => vec![attach_uretprobe_code(
                        leaf,
                        code(bpftime_test_clobbering, &uretprobe_hits, false),
                    )
                    .unwrap()],
                }
            };
            std::thread::sleep(std::time::Duration::from_micros(200));
            for id in ids {
                detach(id).unwrap();
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    for (name, hits) in [
        ("short", &short_hits),
        ("full", &full_hits),
        ("closure", &closure_hits),
        ("pair", &pair_hits),
        ("uretprobe alone", &uretprobe_hits),
    ] {
        assert!(
            hits.load(Ordering::Relaxed) > 0,
            "the {name} path saw calls"
        );
    }
    assert!(calls.load(Ordering::Relaxed) > 0);
}

/// The status flags live at the call, under the short save as under the full one.
#[test]
fn the_short_save_reports_the_status_flags_live_at_the_call() {
    use std::mem::offset_of;
    with_flag();
    let _turn = one_at_a_time();
    let seen = Arc::new(AtomicU64::new(0));
    let f = addr(flagged as *const ());
    // SAFETY: `flagged` is a whole function of this binary; the handler reads the flags
    // word only.
    let id = unsafe {
        attach_uprobe_code(
            HookAddress::function_entry(f),
            code_reading(
                bpftime_test_record_flags,
                &seen,
                true,
                word(offset_of!(PtRegs, flags)),
            ),
        )
    }
    .unwrap();
    for (a, b) in CMP_CASES {
        // SAFETY: plain assembly: compares, then calls `flagged` with an aligned stack.
        unsafe { bpftime_test_cmp_then_call(a, b, flagged) };
        let flags = seen.load(Ordering::SeqCst);
        assert_eq!(
            flags & STATUS,
            status_flags_of_cmp(a, b),
            "cmp {a:#x}, {b:#x}"
        );
        assert_eq!(
            flags & 0x602,
            0x202,
            "IF and bit 1 set, DF clear: {flags:#x}"
        );
    }
    detach(id).unwrap();
}

#[inline(never)]
extern "C" fn float_math(a: f64, b: f64, c: f32) -> f64 {
    black_box(a) * b + f64::from(c)
}

#[test]
fn vector_and_scratch_registers_survive_a_lone_handler_that_changes_them() {
    with_flag();
    let _turn = one_at_a_time();
    let count = Arc::new(AtomicU64::new(0));
    let f = addr(float_math as *const ());
    // SAFETY: `float_math` is a whole function of this binary; the handler says it changes
    // the vector registers, so the hook saves them.
    let id = unsafe {
        attach_uprobe_code(
            HookAddress::function_entry(f),
            code(bpftime_test_clobbering, &count, false),
        )
    }
    .unwrap();
    let call = black_box(float_math as extern "C" fn(f64, f64, f32) -> f64);
    assert_eq!(call(1.5, 4.0, 0.25), 6.25);
    assert_eq!(call(-2.0, 8.5, 1.0), -16.0);
    detach(id).unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 2);

    // Every scratch register a caller may keep across the call comes back, at an entry
    // hook and at an instruction hook alike.
    let leaf = addr(bpftime_test_leaf as *const ());
    for at in [
        HookAddress::function_entry(leaf),
        HookAddress::instruction(leaf),
    ] {
        // SAFETY: `bpftime_test_leaf` is 6 bytes, a 5-byte instruction and `ret`; the
        // first attach there picks the stub, which the later one keeps.
        let id = unsafe { attach_uprobe_code(at, code(bpftime_test_clobbering, &count, false)) }
            .unwrap();
        for x in [0u64, 1 << 40, u64::MAX - 16] {
            // SAFETY: plain assembly taking and returning integers.
            assert_eq!(unsafe { bpftime_test_scratch_kept(black_box(x)) }, 0);
        }
        detach(id).unwrap();
    }
    assert_eq!(count.load(Ordering::SeqCst), 2 + 6);
}

#[inline(never)]
extern "C" fn flagged() {
    black_box(0);
}

/// OF SF ZF AF PF CF after `cmp a, b`.
fn status_flags_of_cmp(a: u64, b: u64) -> u64 {
    let flags: u64;
    // SAFETY: compares two registers and reads the flags through the stack.
    unsafe {
        std::arch::asm!(
            "cmp {a}, {b}",
            "pushfq",
            "pop {f}",
            a = in(reg) a,
            b = in(reg) b,
            f = out(reg) flags,
        )
    };
    flags & STATUS
}

const STATUS: u64 = 0x800 | 0x80 | 0x40 | 0x10 | 0x4 | 0x1;

#[test]
fn function_entry_hooks_report_the_status_flags_live_at_the_call() {
    with_flag();
    let _turn = one_at_a_time();
    let cases = CMP_CASES;
    let expected: Vec<u64> = cases
        .iter()
        .map(|&(a, b)| status_flags_of_cmp(a, b))
        .collect();
    assert!(expected.iter().any(|f| f & 0x800 != 0), "cases cover OF");
    let f = addr(flagged as *const ());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let closure: Handler = Arc::new(move |r: &mut PtRegs| s.lock().unwrap().push(r.flags));
    let last = Arc::new(AtomicU64::new(0));
    let mut direct = Vec::new();
    // SAFETY: `flagged` is a whole function of this binary, entered by call.
    let id = unsafe { attach_uprobe(HookAddress::function_entry(f), closure) }.unwrap();
    for &(a, b) in &cases {
        // SAFETY: plain assembly: compares, then calls `flagged` with an aligned stack.
        unsafe { bpftime_test_cmp_then_call(a, b, flagged) };
    }
    detach(id).unwrap();
    // The same through the stub's direct call.
    // SAFETY: as above; the handler stores one word at `arg`.
    let id = unsafe {
        attach_uprobe_code(
            HookAddress::function_entry(f),
            code(bpftime_test_record_flags, &last, true),
        )
    }
    .unwrap();
    for &(a, b) in &cases {
        // SAFETY: as above.
        unsafe { bpftime_test_cmp_then_call(a, b, flagged) };
        direct.push(last.load(Ordering::SeqCst));
    }
    detach(id).unwrap();
    for reported in [seen.lock().unwrap().clone(), direct] {
        assert_eq!(reported.len(), cases.len());
        for (flags, want) in reported.iter().zip(&expected) {
            assert_eq!(flags & STATUS, *want, "{flags:#x}");
            assert_eq!(flags & 0x202, 0x202, "IF and bit 1 are set: {flags:#x}");
            assert_eq!(
                flags & 0x400,
                0,
                "DF is clear at a function entry: {flags:#x}"
            );
        }
    }
}

/// The return stub reads the flags as the function-entry stub does (restoring none, as
/// they are dead at a return): a uretprobe's handler sees the status flags live at the
/// return, and the function's return value is the caller's.
#[test]
fn uretprobes_report_the_status_flags_live_at_the_return() {
    with_flag();
    let cases = CMP_CASES;
    let f = addr(bpftime_test_cmp_then_return as *const ());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let closure: Handler = Arc::new(move |r: &mut PtRegs| s.lock().unwrap().push((r.flags, r.ax)));
    // SAFETY: a whole assembly function of this binary, entered by call, returning by `ret`.
    let id = unsafe { attach_uretprobe(f, closure) }.unwrap();
    for &(a, b) in &cases {
        // SAFETY: plain assembly: moves, compares and returns.
        let r = unsafe { bpftime_test_cmp_then_return(a, b) };
        assert_eq!(r, a, "the return value");
    }
    detach(id).unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), cases.len());
    for ((flags, ax), &(a, b)) in seen.iter().zip(&cases) {
        assert_eq!(flags & STATUS, status_flags_of_cmp(a, b), "{flags:#x}");
        assert_eq!(flags & 0x202, 0x202, "IF and bit 1 are set: {flags:#x}");
        assert_eq!(*ax, a, "rax as returned");
    }
}

#[inline(never)]
extern "C" fn inner(x: u64) -> u64 {
    black_box(x) ^ 0x55
}

#[inline(never)]
extern "C" fn outer(x: u64) -> u64 {
    black_box(x) + 7
}

/// A code handler that calls a hooked function, as a helper calling malloc would.
unsafe extern "C" fn calls_inner(_regs: *mut PtRegs, arg: u64, _: u64) -> u64 {
    let call = black_box(inner as extern "C" fn(u64) -> u64);
    call(arg);
    0
}

#[test]
fn handlers_never_nest_and_masked_threads_run_none() {
    with_flag();
    let inner_count = Arc::new(AtomicU64::new(0));
    let outer_runs = Arc::new(AtomicU64::new(0));
    // SAFETY: both are whole functions of this binary; the handlers do not unwind, and
    // `calls_inner` is Rust, which may change vector registers.
    let ids = unsafe {
        [
            attach_uprobe_code(
                HookAddress::function_entry(addr(inner as *const ())),
                code(bpftime_test_counting, &inner_count, true),
            )
            .unwrap(),
            attach_uprobe_code(
                HookAddress::function_entry(addr(outer as *const ())),
                CodeHandler {
                    entry: calls_inner,
                    arg: 1,
                    owner: outer_runs.clone(),
                    keeps_vector_registers: false,
                    regs_read: u64::MAX,
                },
            )
            .unwrap(),
        ]
    };
    let call_inner = black_box(inner as extern "C" fn(u64) -> u64);
    let call_outer = black_box(outer as extern "C" fn(u64) -> u64);
    for i in 0..10 {
        assert_eq!(call_outer(i), i + 7);
    }
    assert_eq!(
        inner_count.load(Ordering::SeqCst),
        0,
        "inner ran only inside outer's handler"
    );
    for i in 0..5 {
        assert_eq!(call_inner(i), i ^ 0x55);
    }
    assert_eq!(inner_count.load(Ordering::SeqCst), 5);
    std::thread::spawn(move || {
        never_run_handlers_on_this_thread();
        for i in 0..5 {
            call_inner(i);
        }
    })
    .join()
    .unwrap();
    assert_eq!(
        inner_count.load(Ordering::SeqCst),
        5,
        "a masked thread runs no handler"
    );
    for id in ids {
        detach(id).unwrap();
    }
}

#[test]
fn the_flag_is_refused_once_a_hook_exists() {
    with_flag();
    let count = Arc::new(AtomicU64::new(0));
    // SAFETY: `counted` is a whole function of this binary.
    let id = unsafe {
        attach_uprobe_code(
            HookAddress::function_entry(addr(counted as *const ())),
            code(bpftime_test_counting, &count, true),
        )
    }
    .unwrap();
    // SAFETY: refused before anything changes.
    let err = unsafe { use_static_tls_flag(flag_offset()) }.unwrap_err();
    assert!(
        matches!(err, AttachError::ThreadFlagRefused { .. }),
        "{err}"
    );
    detach(id).unwrap();
}

/// A uprobe counting calls and a uretprobe adding up return values, both code, at `f`:
/// the counters, and the hooks to detach.
fn code_pair(f: usize) -> (Arc<AtomicU64>, Arc<AtomicU64>, [HookId; 2]) {
    let (entries, returned) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    // SAFETY: the tests pass whole functions of this binary, entered by call; the
    // handlers are the assembly above, counting into what they hold.
    let ids = unsafe {
        [
            attach_uprobe_code(
                HookAddress::function_entry(f),
                code(bpftime_test_counting, &entries, true),
            )
            .unwrap(),
            attach_uretprobe_code(f, code(bpftime_test_add_return_value, &returned, true)).unwrap(),
        ]
    };
    (entries, returned, ids)
}

#[inline(never)]
extern "C" fn paired(x: u64) -> u64 {
    black_box(x).wrapping_mul(3)
}

/// A uprobe and a uretprobe of code (funclatency's shape): the stubs run them and keep the
/// pending calls themselves. Every call from four threads is seen at entry and at return,
/// with its return value, and returns what it should.
#[test]
fn a_code_pair_sees_every_call_and_return_from_many_threads() {
    with_flag();
    let _turn = one_at_a_time();
    let f = addr(paired as *const ());
    let (entries, returned, ids) = code_pair(f);
    calls_from_four_threads(black_box(paired as extern "C" fn(u64) -> u64));
    for id in ids {
        detach(id).unwrap();
    }
    assert_eq!(entries.load(Ordering::SeqCst), 40_000);
    assert_eq!(
        returned.load(Ordering::SeqCst),
        4 * 3 * (0..10_000u64).sum::<u64>()
    );
}

#[inline(never)]
extern "C" fn depth(n: u64) -> u64 {
    let next = black_box(depth as extern "C" fn(u64) -> u64);
    if n == 0 {
        0
    } else {
        next(n - 1) + 1
    }
}

/// Nested pending calls of a code pair return in order, each to its own caller.
#[test]
fn a_code_pair_on_a_recursive_function_returns_every_level() {
    with_flag();
    let _turn = one_at_a_time();
    let f = addr(depth as *const ());
    let (entries, returned, ids) = code_pair(f);
    let call = black_box(depth as extern "C" fn(u64) -> u64);
    for _ in 0..100 {
        assert_eq!(call(20), 20);
    }
    for id in ids {
        detach(id).unwrap();
    }
    assert_eq!(entries.load(Ordering::SeqCst), 100 * 21);
    // Each level returns its depth: 0 + 1 + .. + 20.
    assert_eq!(
        returned.load(Ordering::SeqCst),
        100 * (0..=20u64).sum::<u64>()
    );
}

static WAITING: AtomicBool = AtomicBool::new(false);
static GO_ON: AtomicBool = AtomicBool::new(false);

#[inline(never)]
extern "C" fn waits(x: u64) -> u64 {
    WAITING.store(true, Ordering::SeqCst);
    while !GO_ON.load(Ordering::SeqCst) {
        std::hint::spin_loop();
    }
    black_box(x).wrapping_mul(3)
}

/// A call pending when its site's handlers change returns through whichever path the new
/// ones take: hijacked by the stubs and given back by Rust (a closure joined the pair), and
/// the other way round (the closure left).
#[test]
fn a_pending_call_returns_right_when_the_pair_path_comes_or_goes() {
    with_flag();
    let _turn = one_at_a_time();
    let f = addr(waits as *const ());
    let returned = Arc::new(AtomicU64::new(0));
    let closure_runs = Arc::new(AtomicU64::new(0));
    let runs = closure_runs.clone();
    let closure: Handler = Arc::new(move |_| {
        runs.fetch_add(1, Ordering::SeqCst);
    });
    // SAFETY: a whole function of this binary; the handler is the assembly above.
    let ret =
        unsafe { attach_uretprobe_code(f, code(bpftime_test_add_return_value, &returned, true)) }
            .unwrap();
    let call = black_box(waits as extern "C" fn(u64) -> u64);
    for (round, closure_first) in [(1u64, false), (2, true)] {
        WAITING.store(false, Ordering::SeqCst);
        GO_ON.store(false, Ordering::SeqCst);
        // Round 1 enters as a pair and returns with a closure there too; round 2 enters
        // with the closure and returns as a pair.
        // SAFETY: as above; the closure only counts.
        let joined = closure_first.then(|| {
            unsafe { attach_uprobe(HookAddress::function_entry(f), closure.clone()) }.unwrap()
        });
        std::thread::scope(|s| {
            let t = s.spawn(|| call(round));
            while !WAITING.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            let joined_late = (!closure_first).then(|| {
                unsafe { attach_uprobe(HookAddress::function_entry(f), closure.clone()) }.unwrap()
            });
            if let Some(id) = joined {
                detach(id).unwrap();
            }
            GO_ON.store(true, Ordering::SeqCst);
            assert_eq!(t.join().unwrap(), round * 3, "round {round}");
            if let Some(id) = joined_late {
                detach(id).unwrap();
            }
        });
    }
    detach(ret).unwrap();
    assert_eq!(returned.load(Ordering::SeqCst), 3 + 6, "both returns seen");
    assert_eq!(
        closure_runs.load(Ordering::SeqCst),
        1,
        "the closure saw round 2's entry"
    );
}
