//! Every helper of the registry (`bpftime_isa::helpers`), which is every helper the
//! verifier accepts, either runs on each engine it is marked for or is refused at load
//! for the others with a message naming the helper and the engine:
//! - CPU: a tiny program calling it passes the verifier, then runs on the interpreter
//!   and on the x86-64 JIT with the runtime's helpers, and both give the answer the
//!   case expects;
//! - GPU: a program calling it lowers to PTX (which `ptxas` accepts, when found);
//! - elsewhere: the verifier refuses it ("helper bpf_loop#181 is not available on the
//!   GPU") and the GPU lowering names it too.

use std::collections::HashMap;
use std::sync::Arc;

use bpftime_interpreter::{execute, Environment, HelperFn, MemoryPolicy};
use bpftime_isa::asm::assemble;
use bpftime_isa::helpers::{Engine, HelperDef, REGISTRY};
use bpftime_isa::uapi::{helper as h, map_flags, map_type as mt, prog_type};
use bpftime_isa::{opcode as op, Insn};
use bpftime_jit_ptx::{compile, PtxOptions, StandardGpuEnv};
use bpftime_jit_x86::{JitOptions, JitProgram};
use bpftime_runtime::helpers::helper_by_id;
use bpftime_runtime::{Map, MapSpec, Store};
use bpftime_verifier::{verify, MapDesc, Options, ProgramInfo, RejectKind, PT_REGS_SIZE};

/// What a case's r0 must be on both CPU engines.
enum Expect {
    Exact(u64),
    /// Whatever the interpreter answers, the JIT answers too.
    Same,
    /// A property of a value that changes between runs (clocks, random numbers).
    Holds(&'static str, fn(u64) -> bool),
}

/// The maps the cases use, by the fd their `lddw`s name.
struct Maps {
    store: Option<Store>,
    by_fd: HashMap<i32, Arc<Map>>,
}

const ARRAY: i32 = 1;
const HASH: i32 = 2;
const QUEUE: i32 = 3;
const RINGBUF: i32 = 4;
const PROG_ARRAY: i32 = 5;
const PERF: i32 = 6;
const STACKS: i32 = 7;
const CGROUPS: i32 = 8;
const TASKS: i32 = 9;
/// Global constants as libbpf makes `.rodata`: an array of one element that programs
/// cannot write (`BPF_F_RDONLY_PROG`), frozen once filled. Constant strings live here:
/// `bpf_snprintf`'s format at offset 0, `bpf_strncmp`'s string at 8.
const RODATA: i32 = 10;
const RODATA_VALUE: &[u8; 16] = b"%d\0\0\0\0\0\0abd\0\0\0\0\0";

impl Maps {
    /// `test` names the store with the process id: the tests of this file run at once,
    /// and one's teardown must not take the other's store away.
    fn new(test: &str) -> Maps {
        let name = format!("test-helper-registry-{test}-{}", std::process::id());
        let store = Store::create_or_open(&name).expect("a store");
        let spec = |map_type, key_size, value_size, max_entries, map_flags| MapSpec {
            map_type,
            key_size,
            value_size,
            max_entries,
            map_flags,
            btf_id: 1,
            btf_key_type_id: 1,
            btf_value_type_id: 2,
            ..MapSpec::default()
        };
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        let specs = [
            (ARRAY, spec(mt::ARRAY, 4, 8, 4, 0)),
            (HASH, spec(mt::HASH, 4, 8, 16, 0)),
            (QUEUE, spec(mt::QUEUE, 0, 8, 16, 0)),
            (RINGBUF, spec(mt::RINGBUF, 0, 0, 4096 * 4, 0)),
            (PROG_ARRAY, spec(mt::PROG_ARRAY, 4, 4, 4, 0)),
            (PERF, spec(mt::PERF_EVENT_ARRAY, 4, 4, cpus.max(128), 0)),
            (STACKS, spec(mt::STACK_TRACE, 4, 8 * 16, 16, 0)),
            (CGROUPS, spec(mt::CGROUP_ARRAY, 4, 4, 1, 0)),
            (
                TASKS,
                spec(mt::TASK_STORAGE, 4, 8, 0, map_flags::NO_PREALLOC),
            ),
            (RODATA, spec(mt::ARRAY, 4, 16, 1, map_flags::RDONLY_PROG)),
        ];
        let mut by_fd = HashMap::new();
        for (fd, s) in specs {
            let m = Map::create(&store, &s).unwrap_or_else(|e| panic!("map {fd}: {e}"));
            by_fd.insert(fd, Arc::new(m));
        }
        by_fd[&ARRAY]
            .update(&0u32.to_ne_bytes(), &7u64.to_ne_bytes(), 0)
            .expect("seed the array");
        let rodata = &by_fd[&RODATA];
        rodata
            .update(&0u32.to_ne_bytes(), RODATA_VALUE, 0)
            .expect("fill the constants");
        rodata.freeze().expect("freeze the constants");
        Maps {
            store: Some(store),
            by_fd,
        }
    }

    fn desc(&self, fd: i32) -> Option<MapDesc> {
        let m = self.by_fd.get(&fd)?;
        Some(MapDesc {
            map_type: m.map_type(),
            key_size: m.key_size(),
            value_size: m.value_size(),
            max_entries: m.max_entries(),
            flags: m.map_flags(),
            frozen: m.is_frozen(),
            frozen_value: m.frozen_value().map(Into::into),
        })
    }

    /// `insns` with every map `lddw` loading the map's address (or its value's), as the
    /// loaders do.
    fn relocate(&self, insns: &[Insn]) -> Vec<Insn> {
        let mut out = insns.to_vec();
        let mut pc = 0;
        while pc < out.len() {
            let src = out[pc].src;
            if out[pc].is_lddw() && matches!(src, op::PSEUDO_MAP_FD | op::PSEUDO_MAP_VALUE) {
                let m = &self.by_fd[&out[pc].imm];
                let addr = if src == op::PSEUDO_MAP_FD {
                    Arc::as_ptr(m) as u64
                } else {
                    // SAFETY: the key is 4 live bytes; the verifier let only arrays of
                    // one element through, whose element 0 exists.
                    let value = unsafe { m.prog_lookup(0u32.to_ne_bytes().as_ptr()) };
                    value as u64 + u64::from(out[pc + 1].imm as u32)
                };
                out[pc].src = 0;
                out[pc].imm = addr as u32 as i32;
                out[pc + 1].imm = (addr >> 32) as u32 as i32;
                pc += 2;
            } else {
                pc += 1;
            }
        }
        out
    }
}

impl Drop for Maps {
    fn drop(&mut self) {
        self.by_fd.clear();
        if let Some(s) = self.store.take() {
            let _ = s.destroy();
        }
    }
}

/// Assembles `src`, where `lddw %rN, map:FD` names a map, `lddw %rN, mapval:FD:OFF` the
/// address `OFF` bytes into its value and `lddw %rN, func:SLOT` a callback starting at
/// that slot.
fn program(src: &str) -> Vec<Insn> {
    let mut marks = Vec::new();
    let mut text = String::new();
    for line in src.lines() {
        let line = line.trim();
        if let Some((head, what)) = line.split_once(", map:") {
            marks.push((op::PSEUDO_MAP_FD, what.parse::<i32>().unwrap()));
            text.push_str(&format!("{head}, 0\n"));
        } else if let Some((head, what)) = line.split_once(", mapval:") {
            let (fd, off) = what.split_once(':').unwrap();
            marks.push((op::PSEUDO_MAP_VALUE, fd.parse::<i32>().unwrap()));
            text.push_str(&format!("{head}, {}\n", off.parse::<i64>().unwrap() << 32));
        } else if let Some((head, what)) = line.split_once(", func:") {
            marks.push((op::PSEUDO_FUNC, what.parse::<i32>().unwrap()));
            text.push_str(&format!("{head}, 0\n"));
        } else if !line.is_empty() {
            marks.push((0, 0));
            text.push_str(line);
            text.push('\n');
        }
    }
    let mut insns = assemble(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    // Walk the slots beside the lines: an lddw takes two.
    let mut pc = 0;
    for (src, v) in marks {
        if src == op::PSEUDO_MAP_FD || src == op::PSEUDO_MAP_VALUE {
            insns[pc].src = src;
            insns[pc].imm = v;
        } else if src == op::PSEUDO_FUNC {
            insns[pc].src = src;
            insns[pc].imm = v - pc as i32 - 1;
        }
        pc += if insns[pc].is_lddw() { 2 } else { 1 };
    }
    insns
}

fn same_thread_ids(v: u64) -> bool {
    // SAFETY: getpid and gettid have no preconditions.
    v == unsafe { ((libc::getpid() as u64) << 32) | libc::gettid() as u64 }
}

fn uid_gid(v: u64) -> bool {
    // SAFETY: getuid and getgid have no preconditions.
    v == unsafe { ((libc::getgid() as u64) << 32) | libc::getuid() as u64 }
}

/// A program calling helper `id` and what it returns on the CPU.
fn cpu_case(id: u32) -> (String, Expect) {
    use Expect::*;
    let read = |n| {
        (
            format!(
                "stdw [%r10-8], 0x11223344\nmov %r1, %r10\nadd %r1, -16\nmov %r2, 8\n\
                 mov %r3, %r10\nadd %r3, -8\ncall {n}\nldxdw %r0, [%r10-16]\nexit"
            ),
            Exact(0x1122_3344),
        )
    };
    let read_str = |n| {
        (
            format!(
                "stdw [%r10-8], 0x636261\nmov %r1, %r10\nadd %r1, -16\nmov %r2, 8\n\
                 mov %r3, %r10\nadd %r3, -8\ncall {n}\nexit"
            ),
            Exact(4),
        )
    };
    let no_args = |n| format!("call {n}\nexit");
    let nonzero: Expect = Holds("non-zero", |v| v != 0);
    match id {
        h::MAP_LOOKUP_ELEM => (
            "stw [%r10-4], 0\nlddw %r1, map:1\nmov %r2, %r10\nadd %r2, -4\ncall 1\n\
             jeq %r0, 0, +2\nldxdw %r0, [%r0]\nexit\nmov %r0, 999\nexit"
                .into(),
            Exact(7),
        ),
        h::MAP_UPDATE_ELEM => (
            "stw [%r10-4], 3\nstdw [%r10-16], 42\nlddw %r1, map:2\nmov %r2, %r10\nadd %r2, -4\n\
             mov %r3, %r10\nadd %r3, -16\nmov %r4, 0\ncall 2\nexit"
                .into(),
            Exact(0),
        ),
        h::MAP_DELETE_ELEM => (
            "stw [%r10-4], 9\nlddw %r1, map:2\nmov %r2, %r10\nadd %r2, -4\ncall 3\nexit".into(),
            Exact(-2i64 as u64),
        ),
        h::PROBE_READ | h::PROBE_READ_USER | h::PROBE_READ_KERNEL => read(id),
        h::PROBE_READ_STR | h::PROBE_READ_USER_STR | h::PROBE_READ_KERNEL_STR => read_str(id),
        h::KTIME_GET_NS | h::KTIME_GET_BOOT_NS | h::KTIME_GET_COARSE_NS => (no_args(id), nonzero),
        // No trace pipe is set in this process: -ENOENT, on both engines.
        h::TRACE_PRINTK => (
            "stw [%r10-8], 0x6968\nmov %r1, %r10\nadd %r1, -8\nmov %r2, 4\ncall 6\nexit".into(),
            Exact(-2i64 as u64),
        ),
        h::TRACE_VPRINTK => (
            "stw [%r10-8], 0x6968\nmov %r1, %r10\nadd %r1, -8\nmov %r2, 4\nmov %r3, 0\n\
             mov %r4, 0\ncall 177\nexit"
                .into(),
            Exact(-2i64 as u64),
        ),
        h::GET_PRANDOM_U32 => (no_args(id), Holds("a u32", |v| v <= u32::MAX as u64)),
        h::GET_SMP_PROCESSOR_ID => (no_args(id), Holds("a CPU number", |v| v < 65536)),
        // An empty slot: the call falls through.
        h::TAIL_CALL => (
            "lddw %r2, map:5\nmov %r3, 0\ncall 12\nmov %r0, 77\nexit".into(),
            Exact(77),
        ),
        h::GET_CURRENT_PID_TGID => (no_args(id), Holds("this thread's ids", same_thread_ids)),
        h::GET_CURRENT_UID_GID => (no_args(id), Holds("this process's ids", uid_gid)),
        h::GET_CURRENT_COMM => (
            "mov %r1, %r10\nadd %r1, -16\nmov %r2, 16\ncall 16\nldxdw %r1, [%r10-16]\n\
             jne %r0, 0, +1\nmov %r0, %r1\nexit"
                .into(),
            Same,
        ),
        h::GET_CURRENT_TASK => (no_args(id), Same),
        h::GET_CURRENT_TASK_BTF => ("call 158\nmov %r0, 1\nexit".into(), Exact(1)),
        h::PERF_EVENT_OUTPUT => (
            "stdw [%r10-8], 1\nlddw %r2, map:6\nlddw %r3, 0xffffffff\nmov %r4, %r10\n\
             add %r4, -8\nmov %r5, 8\ncall 25\nexit"
                .into(),
            Same,
        ),
        h::GET_STACKID => ("lddw %r2, map:7\nmov %r3, 256\ncall 27\nexit".into(), Same),
        h::GET_STACK => (
            "mov %r2, %r10\nadd %r2, -64\nmov %r3, 64\nmov %r4, 256\ncall 67\nexit".into(),
            Same,
        ),
        // Slot 0 holds no cgroup: -EAGAIN.
        h::CURRENT_TASK_UNDER_CGROUP => (
            "lddw %r1, map:8\nmov %r2, 0\ncall 37\nexit".into(),
            Exact(-11i64 as u64),
        ),
        // Each queue case leaves the queue as it found it.
        h::MAP_PUSH_ELEM | h::MAP_POP_ELEM | h::MAP_PEEK_ELEM => {
            let v = 100 + id;
            let peek = if id == h::MAP_PEEK_ELEM {
                "lddw %r1, map:3\nmov %r2, %r10\nadd %r2, -24\ncall 89\n"
            } else {
                ""
            };
            (
                format!(
                    "stdw [%r10-8], {v}\nlddw %r1, map:3\nmov %r2, %r10\nadd %r2, -8\nmov %r3, 0\n\
                     call 87\n{peek}lddw %r1, map:3\nmov %r2, %r10\nadd %r2, -16\ncall 88\n\
                     ldxdw %r0, [%r10-16]\nexit"
                ),
                Exact(u64::from(v)),
            )
        }
        h::RINGBUF_OUTPUT => (
            "stdw [%r10-8], 1\nlddw %r1, map:4\nmov %r2, %r10\nadd %r2, -8\nmov %r3, 8\n\
             mov %r4, 0\ncall 130\nexit"
                .into(),
            Exact(0),
        ),
        h::RINGBUF_RESERVE | h::RINGBUF_SUBMIT | h::RINGBUF_DISCARD => {
            let end = if id == h::RINGBUF_DISCARD { 133 } else { 132 };
            (
                format!(
                    "lddw %r1, map:4\nmov %r2, 8\nmov %r3, 0\ncall 131\njeq %r0, 0, +5\n\
                     stdw [%r0], 5\nmov %r1, %r0\nmov %r2, 0\ncall {end}\nmov %r0, 1\nexit"
                ),
                Exact(1),
            )
        }
        h::RINGBUF_QUERY => (
            "lddw %r1, map:4\nmov %r2, 0\ncall 134\nexit".into(),
            Holds("the bytes waiting, at most the ring", |v| v <= 4096 * 4),
        ),
        h::TASK_STORAGE_GET | h::TASK_STORAGE_DELETE => (
            "call 158\nmov %r6, %r0\nlddw %r1, map:9\nmov %r2, %r6\nmov %r3, 0\nmov %r4, 1\n\
             call 156\njeq %r0, 0, +5\nlddw %r1, map:9\nmov %r2, %r6\ncall 157\nexit\n\
             mov %r0, 99\nexit"
                .into(),
            Exact(0),
        ),
        // "%d" (a constant, as the kernel requires) of 42 into 8 bytes: 3 (with the
        // NUL), then the first byte.
        h::SNPRINTF => (
            "stdw [%r10-16], 42\nmov %r1, %r10\nadd %r1, -32\nmov %r2, 8\n\
             lddw %r3, mapval:10:0\nmov %r4, %r10\nadd %r4, -16\nmov %r5, 8\ncall 165\n\
             mul %r0, 1000\nldxb %r1, [%r10-32]\nadd %r0, %r1\nexit"
                .into(),
            Exact(3000 + u64::from(b'4')),
        ),
        h::GET_FUNC_IP | h::GET_ATTACH_COOKIE => (no_args(id), Exact(0)),
        // Sums the indices into a stack slot until index 4: 5 iterations, sum 10.
        h::LOOP => (
            "stdw [%r10-8], 0\nmov %r1, 10\nlddw %r2, func:12\nmov %r3, %r10\nadd %r3, -8\n\
             mov %r4, 0\ncall 181\nldxdw %r1, [%r10-8]\nmul %r0, 1000\nadd %r0, %r1\nexit\n\
             ldxdw %r3, [%r2]\nadd %r3, %r1\nstxdw [%r2], %r3\nmov %r0, 0\njne %r1, 4, +1\n\
             mov %r0, 1\nexit"
                .into(),
            Exact(5010),
        ),
        // "abc" against the constant "abd".
        h::STRNCMP => (
            "stw [%r10-8], 0x636261\nmov %r1, %r10\nadd %r1, -8\n\
             mov %r2, 3\nlddw %r3, mapval:10:8\ncall 182\nexit"
                .into(),
            Exact(-1i64 as u64),
        ),
        other => panic!("helper {other} has no CPU case: add one here"),
    }
}

struct RuntimeEnv;

// SAFETY: the runtime's helpers, written for verified programs' arguments; no tail-call
// targets.
unsafe impl Environment for RuntimeEnv {
    fn helper(&self, id: u32) -> Option<HelperFn> {
        helper_by_id(id)
    }

    fn tail_call_target(&self, _map: u64, _index: u64) -> Option<Arc<[Insn]>> {
        None
    }
}

unsafe extern "C" fn no_tail_call_target(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    0
}

fn jit_helper(id: u32) -> Option<u64> {
    if id == h::TAIL_CALL {
        let f: HelperFn = no_tail_call_target;
        return Some(f as usize as u64);
    }
    helper_by_id(id).map(|f| f as usize as u64)
}

fn verify_for(insns: &[Insn], maps: &Maps, gpu: bool) -> Result<(), bpftime_verifier::Rejection> {
    let info = ProgramInfo {
        insns,
        prog_type: prog_type::KPROBE,
        gpu,
        maps: &|fd| maps.desc(fd),
        mem_len: 0,
    };
    verify(&info, &Options::default()).map(|_| ())
}

/// The refusal of a program calling `d` where `engine` lacks it.
fn assert_refused(d: &HelperDef, maps: &Maps, gpu: bool) {
    let insns = program(&format!("call {}\nmov %r0, 0\nexit", d.id));
    let e = verify_for(&insns, maps, gpu).expect_err("a helper the engine lacks loads");
    let engine = if gpu { "GPU" } else { "CPU" };
    let want = format!(
        "helper {}#{} is not available on the {engine}",
        d.name, d.id
    );
    assert!(
        matches!(
            e.kind,
            RejectKind::HelperNotOnGpu { .. } | RejectKind::HelperNotOnCpu { .. }
        ) && e.kind.to_string() == want,
        "{}: refused with `{}`, not `{want}`",
        d.name,
        e.kind
    );
}

#[test]
fn every_helper_runs_on_its_engines_or_is_refused_at_load() {
    let maps = Maps::new("cpu");
    let mut ctx = vec![0u8; PT_REGS_SIZE as usize];
    let ctx_addr = ctx.as_mut_ptr() as u64;
    let mut ran = 0;
    for d in REGISTRY {
        if !d.available_on(Engine::Interpreter) {
            assert_refused(d, &maps, false);
            continue;
        }
        let (src, expect) = cpu_case(d.id);
        let insns = program(&src);
        if let Err(e) = verify_for(&insns, &maps, false) {
            panic!(
                "{}: the verifier refuses its case: {}\n{src}",
                d.name,
                e.log()
            );
        }
        let insns = maps.relocate(&insns);
        // SAFETY: the program was verified; its maps live in `maps`, its context in `ctx`.
        let policy = unsafe { MemoryPolicy::unchecked() };
        let on_interpreter = execute(&insns, ctx_addr, 0, &RuntimeEnv, &policy)
            .unwrap_or_else(|e| panic!("{} on the interpreter: {e}", d.name));
        let jit = JitProgram::compile(&insns, &jit_helper, &JitOptions::default())
            .unwrap_or_else(|e| panic!("{} on the JIT: {e}", d.name));
        // SAFETY: as for the interpreter.
        let on_jit = unsafe { jit.call(ctx_addr, 0) };
        for (engine, r0) in [("interpreter", on_interpreter), ("JIT", on_jit)] {
            match &expect {
                Expect::Exact(v) => assert_eq!(r0, *v, "{} on the {engine}", d.name),
                Expect::Holds(what, ok) => {
                    assert!(ok(r0), "{} on the {engine}: {r0:#x} is not {what}", d.name)
                }
                Expect::Same => {}
            }
        }
        if let Expect::Same = expect {
            assert_eq!(on_interpreter, on_jit, "{}: the engines disagree", d.name);
        }
        ran += 1;
    }
    println!("{ran} helpers ran on the interpreter and the JIT");
    assert!(ran >= 40, "only {ran} helpers ran");
}

#[test]
fn every_gpu_helper_lowers_and_every_other_is_refused_for_the_gpu() {
    let maps = Maps::new("gpu");
    let ptxas = bpftime_gpu_ptx::toolchain::ptxas_for_tests();
    if ptxas.is_none() {
        eprintln!("skipped: the ptxas check (ptxas not found); lowering is still checked");
    }
    let dir = std::env::temp_dir().join(format!("bpftime-helper-registry-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut lowered = 0;
    for d in REGISTRY {
        // Pointers for the helpers that write x, y and z.
        let insns = program(&format!(
            "mov %r1, %r10\nadd %r1, -8\nmov %r2, %r10\nadd %r2, -16\nmov %r3, %r10\n\
             add %r3, -24\ncall {}\nexit",
            d.id
        ));
        let result = compile(&insns, &StandardGpuEnv, &PtxOptions::default());
        if !d.available_on(Engine::Gpu) {
            assert_refused(d, &maps, true);
            let e = result.expect_err("a helper the GPU lacks lowers");
            assert!(
                e.to_string().contains(&format!("{}#{}", d.name, d.id)),
                "the GPU lowering's refusal does not name {}: {e}",
                d.name
            );
            continue;
        }
        let p = result.unwrap_or_else(|e| panic!("{} does not lower for the GPU: {e}", d.name));
        if let Some(ptxas) = &ptxas {
            let file = dir.join(format!("{}.ptx", d.name));
            std::fs::write(&file, &p.ptx).unwrap();
            if let Err(e) =
                bpftime_gpu_ptx::toolchain::run_ptxas(ptxas, &file, 90, !p.externs.is_empty())
            {
                panic!("ptxas refuses {}: {e}", d.name);
            }
        }
        lowered += 1;
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("{lowered} helpers lowered for the GPU");
    assert!(lowered >= 25, "only {lowered} GPU helpers");
}
