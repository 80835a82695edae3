//! Map operation costs, bpftime against the kernel on the same machine, in one run.
//!
//! - From a program: the same eBPF program (one `bpf_map_lookup_elem` or
//!   `bpf_map_update_elem` on a hash or array map) run by the kernel through
//!   `BPF_PROG_TEST_RUN` (an XDP program, whose test runs report their own mean
//!   time) and by bpftime's x86-64 JIT against a store map. Each figure has the
//!   cost of running an empty program subtracted, so it is the operation alone.
//!   "insert, lookup, delete" is funclatency's pattern on its map of start times:
//!   a u64 key inserted, looked up and deleted again in one run.
//! - From a loader: `bpf(BPF_MAP_*_ELEM)` served by the kernel, and by the shim
//!   in this process (what a preloaded tool pays, minus the interposition).
//!
//! Run: `cargo bench -p bpftime-tests --bench map_ops [-- WORD]` (as root for the
//! kernel columns; WORD keeps only the rows whose operation contains it, as `program`).
//! Prints a Markdown table of medians over rounds.

use bpftime_isa::uapi::{cmd, helper, map_type, prog_type};
use bpftime_isa::{asm::assemble, opcode as op, Insn};
use bpftime_jit_x86::{ArrayMapLayout, JitEnv, JitOptions, JitProgram, PerCpuCopies};
use bpftime_runtime::{helpers, Map, MapSpec, Store};
use bpftime_shim::Shim;
use bpftime_tests::bpf::{put32, put64, Bpf, Kernel, Ours};
use std::hint::black_box;
use std::time::Instant;

const ROUNDS: usize = 11;
const SYSCALL_OPS: u64 = 200_000;
const PROGRAM_RUNS: u32 = 2_000_000;
const KEY: u32 = 3;

const EMPTY: &str = "mov %r0, 2\nexit";
const LOOKUP: &str = "
    stw [%r10-4], 3
    lddw %r1, 0
    mov %r2, %r10
    add %r2, -4
    call 1
    mov %r0, 2
    exit";
const UPDATE: &str = "
    stw [%r10-4], 3
    stdw [%r10-16], 7
    lddw %r1, 0
    mov %r2, %r10
    add %r2, -4
    mov %r3, %r10
    add %r3, -16
    mov %r4, 0
    call 2
    mov %r0, 2
    exit";

/// funclatency's use of its `starts` map in one run: the entry probe's insert, then
/// the return probe's lookup and delete of the same u64 key.
const INSERT_LOOKUP_DELETE: &str = "
    stdw [%r10-8], 0x1234
    stdw [%r10-16], 7
    lddw %r1, 0
    mov %r2, %r10
    add %r2, -8
    mov %r3, %r10
    add %r3, -16
    mov %r4, 0
    call 2
    lddw %r1, 0
    mov %r2, %r10
    add %r2, -8
    call 1
    jeq %r0, 0, +5
    lddw %r1, 0
    mov %r2, %r10
    add %r2, -8
    call 3
    mov %r0, 2
    exit";

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `text` with each of its `lddw`s loading `map` the way `patch` says.
fn program(text: &str, patch: impl Fn(&mut Insn, &mut Insn)) -> Vec<Insn> {
    let mut insns = assemble(text).expect("bench programs assemble");
    let mut pc = 0;
    while pc < insns.len() {
        if insns[pc].is_lddw() {
            let (a, b) = insns.split_at_mut(pc + 1);
            patch(&mut a[pc], &mut b[0]);
            pc += 1;
        }
        pc += 1;
    }
    insns
}

struct KernelMap {
    fd: u32,
}

impl KernelMap {
    /// A map with 4-byte keys, 8-byte values and 1024 entries, holding key `KEY`.
    fn create(t: u32) -> Option<KernelMap> {
        let m = KernelMap::empty(t, 4, 1024)?;
        elem(&mut Kernel, m.fd, cmd::MAP_UPDATE_ELEM);
        Some(m)
    }

    fn empty(t: u32, key_size: u32, max_entries: u32) -> Option<KernelMap> {
        let mut a = [0u8; 128];
        put32(&mut a, 0, t);
        put32(&mut a, 4, key_size);
        put32(&mut a, 8, 8);
        put32(&mut a, 12, max_entries);
        let fd = Kernel.call(cmd::MAP_CREATE, &mut a).ok()? as u32;
        Some(KernelMap { fd })
    }

    /// Mean ns per run of `text` as an XDP program under `BPF_PROG_TEST_RUN`.
    fn run(&self, text: &str) -> Option<f64> {
        let insns = program(text, |i, _| {
            i.src = op::PSEUDO_MAP_FD;
            i.imm = self.fd as i32;
        });
        let code = bpftime_isa::encode(&insns);
        let license = c"GPL";
        let mut a = [0u8; 128];
        put32(&mut a, 0, prog_type::XDP);
        put32(&mut a, 4, insns.len() as u32);
        put64(&mut a, 8, code.as_ptr() as u64);
        put64(&mut a, 16, license.as_ptr() as u64);
        let prog = Kernel.call(cmd::PROG_LOAD, &mut a).ok()? as u32;
        let packet = [0u8; 64];
        let mut times = Vec::new();
        for _ in 0..ROUNDS {
            let mut t = [0u8; 128];
            put32(&mut t, 0, prog);
            put32(&mut t, 8, packet.len() as u32);
            put64(&mut t, 16, packet.as_ptr() as u64);
            put32(&mut t, 32, PROGRAM_RUNS);
            Kernel.call(cmd::PROG_TEST_RUN, &mut t).ok()?;
            times.push(u32::from_ne_bytes(t[36..40].try_into().ok()?) as f64);
        }
        // SAFETY: closing the program fd this function opened.
        unsafe { libc::close(prog as i32) };
        Some(median(times))
    }
}

impl Drop for KernelMap {
    fn drop(&mut self) {
        // SAFETY: closing the map fd this value owns.
        unsafe { libc::close(self.fd as i32) };
    }
}

/// One `bpf()` element operation on key `KEY` of map `fd`.
fn elem(bpf: &mut dyn Bpf, fd: u32, command: u32) -> bool {
    let key = KEY.to_ne_bytes();
    let mut value = 7u64.to_ne_bytes();
    let mut a = [0u8; 128];
    put32(&mut a, 0, fd);
    put64(&mut a, 8, key.as_ptr() as u64);
    put64(&mut a, 16, value.as_mut_ptr() as u64);
    bpf.call(command, &mut a).is_ok()
}

/// Median ns per `bpf()` element operation.
fn syscall_cost(bpf: &mut dyn Bpf, fd: u32, command: u32) -> f64 {
    assert!(elem(bpf, fd, command), "the operation itself fails");
    let mut times = Vec::new();
    for _ in 0..ROUNDS {
        let start = Instant::now();
        for _ in 0..SYSCALL_OPS {
            black_box(elem(bpf, fd, command));
        }
        times.push(start.elapsed().as_nanos() as f64 / SYSCALL_OPS as f64);
    }
    median(times)
}

/// Helpers and array layouts as the agent gives them to the JIT.
struct Env<'a>(&'a Map);

impl JitEnv for Env<'_> {
    fn helper(&self, id: u32) -> Option<u64> {
        (id != helper::TAIL_CALL)
            .then(|| helpers::helper_by_id(id))
            .flatten()
            .map(|f| f as usize as u64)
    }

    fn array_map(&self, map: u64) -> Option<ArrayMapLayout> {
        if map != self.0 as *const Map as u64 {
            return None;
        }
        let v = self.0.array_values()?;
        Some(ArrayMapLayout {
            values: v.base as u64,
            key_stride: v.key_stride,
            max_entries: self.0.max_entries(),
            update_size: v.value_size,
            per_cpu: v
                .per_cpu
                .map(|(cpus, stride)| PerCpuCopies { cpus, stride }),
        })
    }

    fn cpu_number_offset(&self) -> Option<u64> {
        bpftime_runtime::cpu_number_offset()
    }
}

/// Median ns per run of `text` on the JIT, against `map`.
fn jit_cost(map: &Map, text: &str) -> f64 {
    let addr = map as *const Map as u64;
    let insns = program(text, |i, next| {
        i.imm = addr as u32 as i32;
        next.imm = (addr >> 32) as u32 as i32;
    });
    let prog = JitProgram::compile_with(&insns, &Env(map), &JitOptions::default())
        .expect("bench programs compile");
    let mut times = Vec::new();
    for _ in 0..ROUNDS {
        let start = Instant::now();
        for _ in 0..PROGRAM_RUNS {
            // SAFETY: the program only touches its stack and `map`, which outlives it.
            black_box(unsafe { prog.call(0, 0) });
        }
        times.push(start.elapsed().as_nanos() as f64 / PROGRAM_RUNS as f64);
    }
    median(times)
}

fn fmt(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.1}"))
}

fn ratio(kernel: Option<f64>, ours: f64) -> String {
    match kernel {
        Some(k) if ours > 0.05 => format!("{:.1}x", k / ours),
        _ => "n/a".into(),
    }
}

fn main() {
    let name = format!("bench-mapops-{}", std::process::id());
    let store = Store::create_or_open(&name).expect("a store");
    let kernel_ok = bpftime_tests::kernel_unavailable()
        .map(|why| eprintln!("kernel columns skipped: {why}"))
        .is_none();

    // `cargo bench` passes `--bench` to the binary; any other word filters the rows.
    let only = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .unwrap_or_default();
    let wanted = |op: &str| op.contains(only.as_str());
    println!("| operation | map | bpftime ns | kernel ns | kernel / bpftime |");
    println!("|---|---|---|---|---|");
    for (label, t) in [("hash", map_type::HASH), ("array", map_type::ARRAY)] {
        let spec = MapSpec {
            map_type: t,
            key_size: 4,
            value_size: 8,
            max_entries: 1024,
            ..MapSpec::default()
        };
        let map = Map::create(&store, &spec).expect("a store map");
        map.update(&KEY.to_ne_bytes(), &7u64.to_ne_bytes(), 0)
            .expect("seed the key");
        let kmap = kernel_ok.then(|| KernelMap::create(t)).flatten();

        let ours_empty = jit_cost(&map, EMPTY);
        let kernel_empty = kmap.as_ref().and_then(|k| k.run(EMPTY));
        for (op_name, text) in [("program lookup", LOOKUP), ("program update", UPDATE)] {
            if !wanted(op_name) {
                continue;
            }
            let ours = (jit_cost(&map, text) - ours_empty).max(0.0);
            let kernel = kmap
                .as_ref()
                .and_then(|k| k.run(text))
                .zip(kernel_empty)
                .map(|(v, e)| (v - e).max(0.0));
            println!(
                "| {op_name} | {label} | {ours:.1} | {} | {} |",
                fmt(kernel),
                ratio(kernel, ours)
            );
        }

        // The shim needs the map as an fd of its own.
        let mut shim = Ours(Shim::new(Store::open(&name).expect("the store")));
        let mut a = [0u8; 128];
        put32(&mut a, 0, t);
        put32(&mut a, 4, 4);
        put32(&mut a, 8, 8);
        put32(&mut a, 12, 1024);
        let fd = shim.call(cmd::MAP_CREATE, &mut a).expect("shim map") as u32;
        elem(&mut shim, fd, cmd::MAP_UPDATE_ELEM);
        for (op_name, command) in [
            ("bpf() lookup", cmd::MAP_LOOKUP_ELEM),
            ("bpf() update", cmd::MAP_UPDATE_ELEM),
        ] {
            if !wanted(op_name) {
                continue;
            }
            let ours = syscall_cost(&mut shim, fd, command);
            let kernel = kmap
                .as_ref()
                .map(|k| syscall_cost(&mut Kernel, k.fd, command));
            println!(
                "| {op_name} | {label} | {ours:.1} | {} | {} |",
                fmt(kernel),
                ratio(kernel, ours)
            );
        }
    }

    // funclatency's `starts`: u64 pid_tgid -> u64 start time, 10240 entries.
    const FUNCLATENCY_ROW: &str = "program insert, lookup, delete";
    if wanted(FUNCLATENCY_ROW) {
        insert_lookup_delete_row(&store, kernel_ok, FUNCLATENCY_ROW);
    }
    if let Ok(s) = Store::open(&name) {
        let _ = s.destroy();
    }
}

fn insert_lookup_delete_row(store: &Store, kernel_ok: bool, row: &str) {
    let spec = MapSpec {
        map_type: map_type::HASH,
        key_size: 8,
        value_size: 8,
        max_entries: 10240,
        ..MapSpec::default()
    };
    let map = Map::create(store, &spec).expect("a store map");
    let kmap = kernel_ok
        .then(|| KernelMap::empty(map_type::HASH, 8, 10240))
        .flatten();
    let ours = (jit_cost(&map, INSERT_LOOKUP_DELETE) - jit_cost(&map, EMPTY)).max(0.0);
    let kernel = kmap
        .as_ref()
        .and_then(|k| Some(k.run(INSERT_LOOKUP_DELETE)? - k.run(EMPTY)?))
        .map(|v| v.max(0.0));
    println!(
        "| {row} | hash, u64 keys | {ours:.1} | {} | {} |",
        fmt(kernel),
        ratio(kernel, ours)
    );
}
