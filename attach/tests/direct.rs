//! Hooks with the per-thread flag in static TLS, as the agent runs them: a site whose only
//! handler is code is called straight from the stub, and function entries skip the flags.
//! A binary of its own, since the flag must be given before this process's first hook.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};

use bpftime_attach::{
    attach_uprobe, attach_uprobe_code, attach_uretprobe, detach, never_run_handlers_on_this_thread,
    use_static_tls_flag, AttachError, CodeHandler, Handler, HookAddress, PtRegs,
};

// The flag byte, in this executable's static TLS, as the agent's starter library has one.
bpftime_attach::static_tls_flag!(fn flag_offset, "bpftime_test_hook_flag");

fn with_flag() {
    static SET: Once = Once::new();
    SET.call_once(|| {
        // SAFETY: the byte above is ours alone, zero in every thread, and this runs before
        // the first hook of this process (every test calls it first).
        unsafe { use_static_tls_flag(flag_offset()) }.unwrap();
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
    "nop dword ptr [rax + rax]",
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
    fn bpftime_test_add_first_argument(regs: *mut PtRegs, arg: u64, zero: u64) -> u64;
    fn bpftime_test_record_flags(regs: *mut PtRegs, arg: u64, zero: u64) -> u64;
    fn bpftime_test_clobbering(regs: *mut PtRegs, arg: u64, zero: u64) -> u64;
    fn bpftime_test_leaf();
    fn bpftime_test_scratch_kept(x: u64) -> u64;
    fn bpftime_test_cmp_then_call(a: u64, b: u64, f: extern "C" fn());
    fn bpftime_test_cmp_then_return(a: u64, b: u64) -> u64;
}

fn code(entry: CodeEntry, cell: &Arc<AtomicU64>, keeps_vector_registers: bool) -> CodeHandler {
    CodeHandler {
        entry,
        arg: Arc::as_ptr(cell) as u64,
        owner: cell.clone(),
        keeps_vector_registers,
    }
}

fn addr(f: *const ()) -> usize {
    f as usize
}

#[inline(never)]
extern "C" fn counted(x: u64) -> u64 {
    black_box(x).wrapping_mul(3)
}

#[test]
fn a_lone_code_handler_counts_every_call_from_many_threads() {
    with_flag();
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
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for i in 0..10_000 {
                    assert_eq!(call(i), i * 3);
                }
            });
        }
    });
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

#[inline(never)]
extern "C" fn float_math(a: f64, b: f64, c: f32) -> f64 {
    black_box(a) * b + f64::from(c)
}

#[test]
fn vector_and_scratch_registers_survive_a_lone_handler_that_changes_them() {
    with_flag();
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

/// Pairs whose `cmp` sets each status flag, OF included, and clears it.
const CMP_CASES: [(u64, u64); 7] = [
    (1, 2),
    (2, 1),
    (5, 5),
    (i64::MIN as u64, 1),
    (i64::MAX as u64, u64::MAX),
    (0x10, 0x01),
    (0, 0x8000_0000_0000_0000),
];

#[test]
fn function_entry_hooks_report_the_status_flags_live_at_the_call() {
    with_flag();
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
