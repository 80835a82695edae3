//! Execution time of compute-heavy eBPF programs on every engine we can compare, against
//! the same C compiled natively, and compile latency of our JIT and rbpf's.
//!
//! The programs live in `benches/programs/*.c`. Each is compiled twice by clang-19 at -O2:
//! for eBPF with `-mcpu=v2` (what rbpf's JIT handles correctly: it implements 32-bit
//! `mov` as a 64-bit one, which code built for v3's ALU32 relies on being zero-extending),
//! and for the host (generic x86-64) as a shared library, called through a function
//! pointer so that nothing is inlined into the harness. Every engine runs the very same
//! bytecode.
//!
//! Engines: the native build; our interpreter (unchecked memory, as the agent runs verified
//! programs); our x86-64 JIT with its default options (what probes attach with) and with
//! `JitOptions::optimized()`; rbpf's x86-64 JIT. Before anything is timed, the interpreter
//! runs each program with every access checked, and each engine must return what the
//! native build returns; an engine that refuses a program or disagrees is listed with why.
//!
//! The machines are shared and noisy, so every figure is a median over rounds of thread
//! CPU time (time spent descheduled does not count), and each round times every engine on
//! every program in turn, so that a burst of load lands on all of them alike; ratios are
//! taken within this one run.
//!
//! The typical tracing programs that `make -C bpf-examples` builds
//! (`bpf-examples/build/*.bpf.o`), with maps faked as constant addresses and every helper
//! stubbed to return 0, are timed for one run each (their early-exit paths) and for
//! compile latency, along with the bench programs.
//!
//! Run: `cargo bench -p bpftime-jit-x86 --bench engines [-- --rounds N --sample-ms MS
//! --compile-rounds N]`. `CLANG` names the compiler (default `clang-19`),
//! `BPF_EXAMPLES_BUILD` the directory of the tracing objects.

use std::ffi::{CStr, CString};
use std::hint::black_box;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bpftime_interpreter::{execute, Environment, MemoryPolicy};
use bpftime_isa::opcode::{ATOMIC, CALL_HELPER, CALL_INSN, MODE_MASK, PSEUDO_MAP_FD, STX};
use bpftime_isa::{decode, encode, HelperFn, Insn};
use bpftime_jit_x86::{JitOptions, JitProgram};
use goblin::elf::section_header::SHF_EXECINSTR;
use goblin::elf::Elf;

/// What a native build of a program is: `u64 bench_run(void *ctx)`.
type NativeFn = unsafe extern "C" fn(*mut u8) -> u64;

struct Settings {
    rounds: usize,
    sample: Duration,
    compile_rounds: usize,
}

fn settings() -> Result<Settings, String> {
    let mut s = Settings {
        rounds: 21,
        sample: Duration::from_millis(10),
        compile_rounds: 31,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> Result<u64, String> {
            let v = args
                .next()
                .ok_or_else(|| format!("{name} needs a number"))?;
            v.parse()
                .map_err(|_| format!("{name} needs a whole number, not `{v}`"))
        };
        match arg.as_str() {
            "--rounds" => s.rounds = number("--rounds")?.max(1) as usize,
            "--sample-ms" => s.sample = Duration::from_millis(number("--sample-ms")?.max(1)),
            "--compile-rounds" => s.compile_rounds = number("--compile-rounds")?.max(1) as usize,
            // `cargo bench` passes `--bench`, and a filter may follow; neither applies here.
            _ => {}
        }
    }
    Ok(s)
}

/// A pseudo-random sequence, so that inputs are the same on every run.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 ^ (self.0 >> 29)
    }
}

/// A bench program and the context memory it runs over.
struct BenchProgram {
    name: &'static str,
    /// Context memory in 8-byte words, for the programs' aligned u64 fields.
    context_words: usize,
    fill: fn(&mut [u8]),
}

fn put_u64(mem: &mut [u8], at: usize, v: u64) {
    mem[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

const PRIME_LIMIT: u64 = 65_536;
const MEMCPY_WORDS: u64 = 8_192;
const SWITCH_ITERATIONS: u64 = 20_000;
const LOG2_VALUES: u64 = 8_192;
const STRCMP_PAIRS: u64 = 32;
const STRCMP_STRIDE: u64 = 512;

fn programs() -> Vec<BenchProgram> {
    vec![
        BenchProgram {
            name: "prime",
            context_words: 1 + PRIME_LIMIT as usize / 8,
            fill: |m| put_u64(m, 0, PRIME_LIMIT),
        },
        BenchProgram {
            name: "memcpy",
            context_words: 1 + 2 * MEMCPY_WORDS as usize,
            fill: |m| {
                put_u64(m, 0, MEMCPY_WORDS);
                let mut rng = Lcg(1);
                for w in 0..MEMCPY_WORDS as usize {
                    put_u64(m, 8 + 8 * w, rng.next());
                }
            },
        },
        BenchProgram {
            name: "switch",
            context_words: 2,
            fill: |m| {
                put_u64(m, 0, SWITCH_ITERATIONS);
                put_u64(m, 8, 0x1234_5678_9abc_def0);
            },
        },
        BenchProgram {
            name: "log2",
            context_words: 1 + LOG2_VALUES as usize,
            fill: |m| {
                put_u64(m, 0, LOG2_VALUES);
                let mut rng = Lcg(2);
                for i in 0..LOG2_VALUES as usize {
                    // Spread the magnitudes so every bit position occurs.
                    let v = rng.next() >> (rng.next() % 64);
                    put_u64(m, 8 + 8 * i, v);
                }
            },
        },
        BenchProgram {
            name: "strcmp",
            context_words: 2 + (2 * STRCMP_PAIRS * STRCMP_STRIDE) as usize / 8,
            fill: |m| {
                put_u64(m, 0, STRCMP_PAIRS);
                put_u64(m, 8, STRCMP_STRIDE);
                let mut rng = Lcg(3);
                let stride = STRCMP_STRIDE as usize;
                for k in 0..STRCMP_PAIRS as usize {
                    let len = 300 + (k * 5) % 200;
                    let a = 16 + 2 * k * stride;
                    let b = a + stride;
                    for i in 0..len {
                        let c = b'a' + (rng.next() % 26) as u8;
                        m[a + i] = c;
                        m[b + i] = c;
                    }
                    // Every other pair differs in its last byte, one way or the other.
                    match k % 4 {
                        1 => m[b + len - 1] = b'A',
                        3 => m[b + len - 1] = b'~',
                        _ => {}
                    }
                    m[a + len] = 0;
                    m[b + len] = 0;
                }
            },
        },
    ]
}

fn run_clang(clang: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(clang)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {clang} ({e}); install clang-19 or set CLANG"))?;
    if !out.status.success() {
        return Err(format!(
            "{clang} {} failed:\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// Relocations in the ELF `elf` that apply to section `index`.
fn relocations_of(elf: &Elf<'_>, index: usize) -> Vec<goblin::elf::Reloc> {
    elf.shdr_relocs
        .iter()
        .filter(|(rel, _)| elf.section_headers[*rel].sh_info as usize == index)
        .flat_map(|(_, relocs)| relocs.iter())
        .collect()
}

fn section_name<'a>(elf: &'a Elf<'_>, index: usize) -> &'a str {
    elf.shdr_strtab
        .get_at(elf.section_headers[index].sh_name)
        .unwrap_or("?")
}

/// The program in section `bench` of a bench object; it must need no linking.
fn bench_section(object: &[u8], path: &Path) -> Result<Vec<Insn>, String> {
    let elf = Elf::parse(object).map_err(|e| format!("{}: {e}", path.display()))?;
    let index = (0..elf.section_headers.len())
        .find(|&i| section_name(&elf, i) == "bench")
        .ok_or_else(|| format!("{}: no `bench` section", path.display()))?;
    if !relocations_of(&elf, index).is_empty() {
        return Err(format!(
            "{}: the program has relocations (global data or calls); bench programs must be \
             self-contained",
            path.display()
        ));
    }
    let sh = &elf.section_headers[index];
    let range = sh.file_range().ok_or("empty bench section")?;
    decode(&object[range]).map_err(|e| format!("{}: {e}", path.display()))
}

struct Built {
    insns: Vec<Insn>,
    native: NativeFn,
}

/// Compiles `programs/<name>.c` for eBPF and for the host into `dir`.
fn build(clang: &str, name: &str, dir: &Path) -> Result<Built, String> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("benches/programs")
        .join(format!("{name}.c"));
    let source = source.to_str().ok_or("non-UTF-8 source path")?;
    let bpf = dir.join(format!("{name}.bpf.o"));
    let so = dir.join(format!("lib{name}_native.so"));
    let (bpf_s, so_s) = (bpf.to_str().unwrap(), so.to_str().unwrap());
    run_clang(
        clang,
        &[
            "-target", "bpf", "-mcpu=v2", "-O2", "-c", source, "-o", bpf_s,
        ],
    )?;
    run_clang(clang, &["-O2", "-fPIC", "-shared", source, "-o", so_s])?;
    let object = std::fs::read(&bpf).map_err(|e| format!("{}: {e}", bpf.display()))?;
    let insns = bench_section(&object, &bpf)?;

    let so_c = CString::new(so_s).map_err(|e| e.to_string())?;
    // SAFETY: dlopen and dlsym get NUL-terminated strings; the library is one we just built
    // from our own C file and has no constructors. It stays loaded for the life of the
    // process (we never dlclose), so the function pointer stays valid.
    let native = unsafe {
        let handle = libc::dlopen(so_c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if handle.is_null() {
            let why = CStr::from_ptr(libc::dlerror()).to_string_lossy();
            return Err(format!("dlopen {}: {why}", so.display()));
        }
        let sym = libc::dlsym(handle, c"bench_run".as_ptr());
        if sym.is_null() {
            return Err(format!("{}: no symbol bench_run", so.display()));
        }
        std::mem::transmute::<*mut libc::c_void, NativeFn>(sym)
    };
    Ok(Built { insns, native })
}

/// Context memory, 8-byte aligned.
struct Context(Vec<u64>);

impl Context {
    fn new(words: usize, fill: fn(&mut [u8])) -> Self {
        let mut c = Context(vec![0; words]);
        fill(c.bytes());
        c
    }

    fn bytes(&mut self) -> &mut [u8] {
        let len = self.0.len() * 8;
        // SAFETY: the vector owns `len` initialized bytes, and u8 has no alignment needs.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast::<u8>(), len) }
    }
}

/// Every helper a tracing program calls, for every engine: returns 0 and touches nothing,
/// so lookups miss, reservations fail and the programs take their early exits.
unsafe extern "C" fn stub_helper(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    0
}

fn stub_helpers(_: u32) -> Option<u64> {
    Some(stub_helper as *const () as u64)
}

struct StubHelpers;

// SAFETY: the only helper reads no argument and touches no memory.
unsafe impl Environment for StubHelpers {
    fn helper(&self, _id: u32) -> Option<HelperFn> {
        Some(stub_helper as HelperFn)
    }

    fn tail_call_target(&self, _map: u64, _index: u64) -> Option<Arc<[Insn]>> {
        None
    }
}

enum Engine {
    Native(NativeFn),
    Interpreter(Vec<Insn>),
    Jit(JitProgram),
    Rbpf(rbpf::EbpfVmRaw<'static>),
}

/// rbpf reports some programs as errors and aborts on others with a panic (its verifier
/// and JIT say `unimplemented!` for atomics, say); both count as a rejection, with the
/// reason and, for a panic, where in rbpf it happened.
fn rbpf_guard<T>(f: impl FnOnce() -> Result<T, std::io::Error>) -> Result<T, String> {
    let location = Arc::new(std::sync::Mutex::new(String::new()));
    let hook = std::panic::take_hook();
    let seen = location.clone();
    std::panic::set_hook(Box::new(move |info| {
        if let Some(l) = info.location() {
            let file = l.file().rsplit("/src/").next().unwrap_or(l.file());
            *seen.lock().unwrap() = format!(" at src/{file}:{}", l.line());
        }
    }));
    let outcome = catch_unwind(AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    match outcome {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(panic) => Err(format!(
            "panicked{}: {}",
            location.lock().unwrap(),
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        )),
    }
}

/// The first atomic instruction, which rbpf 0.3 implements neither in its verifier nor
/// in its JIT, to name in a rejection.
fn first_atomic(insns: &[Insn]) -> Option<String> {
    let (slot, i) = insns
        .iter()
        .enumerate()
        .find(|(_, i)| i.class() == STX && i.code & MODE_MASK == ATOMIC)?;
    Some(format!(
        "atomic instruction at slot {slot} (opcode {:#04x})",
        i.code
    ))
}

fn rbpf_vm(insns: &[Insn], helpers: &[u32]) -> Result<rbpf::EbpfVmRaw<'static>, String> {
    // rbpf borrows the program for the VM's lifetime; the bench keeps both to the end.
    let bytes: &'static [u8] = Box::leak(encode(insns).into_boxed_slice());
    let mut vm = rbpf_guard(|| rbpf::EbpfVmRaw::new(Some(bytes))).map_err(|e| {
        let atomic = first_atomic(insns).map(|a| format!("; the program has an {a}"));
        format!("verifier: {e}{}", atomic.unwrap_or_default())
    })?;
    for &id in helpers {
        vm.register_helper(id, rbpf_stub_helper)
            .map_err(|e| format!("helper {id}: {e}"))?;
    }
    Ok(vm)
}

fn rbpf_stub_helper(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    0
}

fn rbpf_compile(vm: &mut rbpf::EbpfVmRaw<'static>) -> Result<(), String> {
    rbpf_guard(|| vm.jit_compile()).map_err(|e| format!("JIT: {e}"))
}

impl Engine {
    /// Runs once over `mem`.
    ///
    /// # Safety
    /// The program must only touch `mem` and its stack; [`Row::add`] establishes that
    /// with the interpreter's checked policy before anything runs unchecked.
    unsafe fn run(&self, mem: &mut [u8]) -> u64 {
        let (ptr, len) = (mem.as_mut_ptr(), mem.len());
        // SAFETY: per this function's contract.
        unsafe {
            match self {
                Engine::Native(f) => f(ptr),
                Engine::Interpreter(insns) => {
                    let policy = MemoryPolicy::unchecked();
                    execute(insns, ptr as u64, len as u64, &StubHelpers, &policy)
                        .expect("the checked run succeeded")
                }
                Engine::Jit(p) => p.call(ptr as u64, len as u64),
                // rbpf ties the memory's borrow to the VM's lifetime; a fresh slice over
                // the same bytes for each call satisfies it.
                Engine::Rbpf(vm) => vm
                    .execute_program_jit(std::slice::from_raw_parts_mut(ptr, len))
                    .expect("rbpf runs a compiled program"),
            }
        }
    }
}

/// CPU time this thread has used. Time spent descheduled is the main noise on a shared
/// machine; this clock leaves it out, where a wall clock would count it.
fn thread_cpu_ns() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "CLOCK_THREAD_CPUTIME_ID is available on Linux");
    ts.tv_sec as f64 * 1e9 + ts.tv_nsec as f64
}

/// Nanoseconds per run over `iterations` back-to-back runs.
fn time_runs(engine: &Engine, mem: &mut [u8], iterations: u64) -> f64 {
    let started = thread_cpu_ns();
    for _ in 0..iterations {
        // SAFETY: engines reach a row only after `Row::add` checked them.
        black_box(unsafe { engine.run(black_box(&mut *mem)) });
    }
    (thread_cpu_ns() - started) / iterations as f64
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

fn geomean(xs: &[f64]) -> f64 {
    (xs.iter().map(|x| x.ln()).sum::<f64>() / xs.len() as f64).exp()
}

/// One program on several engines, each `Ok` with what it can run or `Err` with why not.
struct Row {
    program: String,
    slots: usize,
    context: Context,
    /// r0 of the interpreter's run with every access checked, or why it failed; no engine
    /// runs unchecked unless that run succeeded.
    checked: Result<u64, String>,
    /// What every engine must return: native's r0 where there is a native build.
    expected: Option<u64>,
    engines: Vec<(&'static str, Result<Engine, String>)>,
    iterations: Vec<u64>,
    samples: Vec<Vec<f64>>,
}

impl Row {
    fn new(program: &str, insns: &[Insn], mut context: Context) -> Self {
        let mem = context.bytes();
        let start = mem.as_ptr() as u64;
        let policy = MemoryPolicy::checked(std::iter::once(start..start + mem.len() as u64));
        let checked = execute(insns, start, mem.len() as u64, &StubHelpers, &policy)
            .map_err(|e| format!("the checked interpreter stopped it: {e}"));
        Row {
            program: program.to_string(),
            slots: insns.len(),
            context,
            expected: checked.as_ref().ok().copied(),
            checked,
            engines: Vec::new(),
            iterations: Vec::new(),
            samples: Vec::new(),
        }
    }

    /// Adds an engine once it has run the program and returned the expected r0.
    fn add(&mut self, name: &'static str, engine: Result<Engine, String>) {
        let engine = match (&self.checked, self.expected, engine) {
            (_, _, Err(e)) => Err(e),
            // Native code is the reference; it runs whatever the interpreter found.
            (Err(_), _, Ok(e @ Engine::Native(_))) => Ok(e),
            (Err(why), _, Ok(_)) => Err(format!("not run: {why}")),
            (Ok(_), expected, Ok(e)) => {
                // SAFETY: the checked interpreter run kept to the context memory, and every
                // engine runs the same bytecode (or, for native, the same C).
                let got = unsafe { e.run(self.context.bytes()) };
                match expected {
                    Some(want) if got != want => Err(format!(
                        "returned {got:#x} where the reference gives {want:#x}"
                    )),
                    _ => Ok(e),
                }
            }
        };
        self.engines.push((name, engine));
        self.iterations.push(1);
        self.samples.push(Vec::new());
    }
}

/// A bench program's row: native first, as the reference and the baseline.
fn bench_row(p: &BenchProgram, built: &Built) -> Row {
    let mut row = Row::new(p.name, &built.insns, Context::new(p.context_words, p.fill));
    // SAFETY: the native build of our own program touches only its context.
    let native = unsafe { (built.native)(row.context.bytes().as_mut_ptr()) };
    if let Ok(r0) = row.checked {
        if r0 != native {
            row.checked = Err(format!("interpreter gives {r0:#x}, native {native:#x}"));
        }
    }
    row.expected = Some(native);
    row.add("native", Ok(Engine::Native(built.native)));
    row.add("interpreter", Ok(Engine::Interpreter(built.insns.clone())));
    let jit = |opts: JitOptions| {
        JitProgram::compile(&built.insns, &stub_helpers, &opts)
            .map(Engine::Jit)
            .map_err(|e| format!("compile: {e}"))
    };
    row.add("our JIT (default)", jit(JitOptions::default()));
    row.add("our JIT (O2)", jit(JitOptions::optimized()));
    let rbpf = rbpf_vm(&built.insns, &[]).and_then(|mut vm| {
        rbpf_compile(&mut vm)?;
        Ok(Engine::Rbpf(vm))
    });
    row.add("rbpf JIT", rbpf);
    row
}

/// `struct pt_regs` and then some: what a uprobe program's context points to.
const TRACING_CONTEXT_WORDS: usize = 64;

/// O1 code generation for every program: the default before loop-free programs got `O0`.
fn o1_codegen_throughout() -> JitOptions {
    JitOptions {
        loop_free_codegen_level: None,
        ..JitOptions::default()
    }
}

/// A tracing program's row, with its helpers stubbed: one event's worth of work on the
/// early-exit paths. Our JIT's default first, as the baseline.
fn tracing_row(name: &str, insns: &[Insn]) -> Row {
    let mut row = Row::new(name, insns, Context::new(TRACING_CONTEXT_WORDS, |_| {}));
    let jit = |opts: JitOptions| {
        JitProgram::compile(insns, &stub_helpers, &opts)
            .map(Engine::Jit)
            .map_err(|e| format!("compile: {e}"))
    };
    row.add("our JIT (default)", jit(JitOptions::default()));
    row.add("our JIT (O1 codegen)", jit(o1_codegen_throughout()));
    row.add("interpreter", Ok(Engine::Interpreter(insns.to_vec())));
    row
}

fn measure(rows: &mut [Row], s: &Settings) {
    // Calibrate: enough runs per sample to fill the sample time.
    for row in rows.iter_mut() {
        for (i, (_, engine)) in row.engines.iter().enumerate() {
            let Ok(e) = engine else { continue };
            let mem = row.context.bytes();
            time_runs(e, mem, 1);
            let mut n = 1u64;
            loop {
                let started = Instant::now();
                time_runs(e, mem, n);
                let took = started.elapsed();
                if took >= s.sample / 4 || n >= 1 << 26 {
                    let per = took.as_secs_f64() / n as f64;
                    row.iterations[i] = ((s.sample.as_secs_f64() / per) as u64).max(1);
                    break;
                }
                n *= 4;
            }
        }
    }
    for round in 0..s.rounds {
        eprint!("\rround {}/{}", round + 1, s.rounds);
        for row in rows.iter_mut() {
            for (i, (_, engine)) in row.engines.iter().enumerate() {
                let Ok(e) = engine else { continue };
                let ns = time_runs(e, row.context.bytes(), row.iterations[i]);
                row.samples[i].push(ns);
            }
        }
    }
    eprintln!();
}

fn format_ns(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.1} µs", ns / 1e3)
    } else if ns >= 100.0 {
        format!("{ns:.0} ns")
    } else {
        format!("{ns:.1} ns")
    }
}

/// A table of median time per run, each with its ratio to the first engine, and the
/// geometric mean of the ratios per engine.
fn report(title: &str, rows: &[Row]) {
    let Some(first) = rows.first() else { return };
    let names: Vec<&str> = first.engines.iter().map(|(n, _)| *n).collect();
    println!("\n#### {title}\n");
    println!("| program | slots | {} |", names.join(" | "));
    println!("|---|---|{}", "---|".repeat(names.len()));
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let mut problems = Vec::new();
    for row in rows {
        let baseline = match &row.engines[0].1 {
            Ok(_) => Some(median(row.samples[0].clone())),
            Err(_) => None,
        };
        let cells: Vec<String> = row
            .engines
            .iter()
            .enumerate()
            .map(|(i, (name, e))| match (e, baseline) {
                (Err(why), _) => {
                    problems.push(format!("{name} on {}: {why}", row.program));
                    "rejected".to_string()
                }
                (Ok(_), Some(base)) if i > 0 => {
                    let t = median(row.samples[i].clone());
                    ratios[i].push(t / base);
                    format!("{} ({:.2}x)", format_ns(t), t / base)
                }
                (Ok(_), _) => format_ns(median(row.samples[i].clone())),
            })
            .collect();
        println!(
            "| {} | {} | {} |",
            row.program,
            row.slots,
            cells.join(" | ")
        );
    }
    let geo: Vec<String> = ratios
        .iter()
        .enumerate()
        .map(|(i, r)| match i {
            0 => "1x".to_string(),
            _ if r.is_empty() => "-".to_string(),
            _ if r.len() == rows.len() => format!("**{:.2}x**", geomean(r)),
            _ => format!("**{:.2}x** ({} of {})", geomean(r), r.len(), rows.len()),
        })
        .collect();
    println!("| geomean of ratios | | {} |", geo.join(" | "));
    if !problems.is_empty() {
        println!();
    }
    for p in problems {
        println!("- {p}");
    }
}

/// Programs of a libbpf object, with map references patched to fake addresses as a
/// loader would, and the helper ids each calls.
fn tracing_programs(path: &Path) -> Result<Vec<(String, Vec<Insn>)>, String> {
    let object = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let elf = Elf::parse(&object).map_err(|e| format!("{}: {e}", path.display()))?;
    let stem = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("?")
        .trim_end_matches(".bpf.o");
    let mut out = Vec::new();
    for (index, sh) in elf.section_headers.iter().enumerate() {
        if sh.sh_flags & u64::from(SHF_EXECINSTR) == 0 || sh.sh_size == 0 {
            continue;
        }
        let name = section_name(&elf, index);
        let range = sh.file_range().ok_or("empty section")?;
        let mut insns = decode(&object[range]).map_err(|e| format!("{stem}/{name}: {e}"))?;
        for r in relocations_of(&elf, index) {
            let slot = (r.r_offset / 8) as usize;
            let insn = insns
                .get(slot)
                .ok_or_else(|| format!("{stem}/{name}: relocation past the end"))?;
            if !insn.is_lddw() {
                return Err(format!(
                    "{stem}/{name}: relocation at slot {slot} is not a map load (a call into \
                     another section?), which this bench does not link"
                ));
            }
            let fake_map = 0x7f00_0000_0000u64 + 0x1000 * r.r_sym as u64;
            insns[slot].src = PSEUDO_MAP_FD;
            insns[slot].imm = fake_map as u32 as i32;
            insns[slot + 1].imm = (fake_map >> 32) as u32 as i32;
        }
        out.push((format!("{stem}/{name}"), insns));
    }
    Ok(out)
}

fn helper_ids(insns: &[Insn]) -> Vec<u32> {
    let mut ids: Vec<u32> = insns
        .iter()
        .filter(|i| i.code == CALL_INSN && i.src == CALL_HELPER)
        .map(|i| i.imm as u32)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

fn median_time(rounds: usize, mut f: impl FnMut() -> Result<(), String>) -> Result<f64, String> {
    f()?; // warm: thread-local target machines, page allocator
    let mut xs = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = thread_cpu_ns();
        f()?;
        xs.push(thread_cpu_ns() - started);
    }
    Ok(median(xs))
}

fn report_compile(programs: &[(String, Vec<Insn>)], s: &Settings) {
    println!(
        "\n#### Compile latency (median of {} compiles, thread CPU time)\n",
        s.compile_rounds
    );
    println!(
        "| program | slots | our JIT (default) | our JIT (O1 codegen) | our JIT (O2) | rbpf JIT |"
    );
    println!("|---|---|---|---|---|---|");
    let mut problems = Vec::new();
    let mut cell = |name: &str, what: &str, r: Result<f64, String>| match r {
        Ok(ns) => format_ns(ns),
        Err(e) => {
            problems.push(format!("{what} on {name}: {e}"));
            "rejected".to_string()
        }
    };
    for (name, insns) in programs {
        let ours = |opts: JitOptions| {
            median_time(s.compile_rounds, || {
                JitProgram::compile(insns, &stub_helpers, &opts)
                    .map(|p| drop(black_box(p)))
                    .map_err(|e| e.to_string())
            })
        };
        let ids = helper_ids(insns);
        // Only rbpf's compile is timed, as for ours: building its VM runs its verifier.
        let rbpf = (|| {
            let mut warm = rbpf_vm(insns, &ids)?;
            rbpf_compile(&mut warm)?;
            let mut xs = Vec::with_capacity(s.compile_rounds);
            for _ in 0..s.compile_rounds {
                let mut vm = rbpf_vm(insns, &ids)?;
                let started = thread_cpu_ns();
                rbpf_compile(&mut vm)?;
                xs.push(thread_cpu_ns() - started);
            }
            Ok(median(xs))
        })();
        println!(
            "| {name} | {} | {} | {} | {} | {} |",
            insns.len(),
            cell(name, "our JIT (default)", ours(JitOptions::default())),
            cell(name, "our JIT (O1 codegen)", ours(o1_codegen_throughout())),
            cell(name, "our JIT (O2)", ours(JitOptions::optimized())),
            cell(name, "rbpf JIT", rbpf),
        );
    }
    if !problems.is_empty() {
        println!();
    }
    for p in problems {
        println!("- {p}");
    }
}

fn main() -> ExitCode {
    let s = match settings() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("engines bench: {e}");
            return ExitCode::from(2);
        }
    };
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang-19".into());
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("engines-bench");
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("engines bench: cannot create {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    let mut rows = Vec::new();
    let mut compile_set = Vec::new();
    for p in programs() {
        let built = match build(&clang, p.name, &dir) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("engines bench: {e}");
                return ExitCode::FAILURE;
            }
        };
        compile_set.push((p.name.to_string(), built.insns.clone()));
        rows.push(bench_row(&p, &built));
    }

    let examples = std::env::var_os("BPF_EXAMPLES_BUILD")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../bpf-examples/build"));
    let mut objects: Vec<PathBuf> = std::fs::read_dir(&examples)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.to_string_lossy().ends_with(".bpf.o"))
                .collect()
        })
        .unwrap_or_default();
    objects.sort();
    if objects.is_empty() {
        eprintln!(
            "engines bench: no tracing objects in {}; run `make -C bpf-examples` for the \
             tracing-program compile latency",
            examples.display()
        );
    }
    let mut tracing_rows = Vec::new();
    for o in &objects {
        match tracing_programs(o) {
            Ok(progs) => {
                tracing_rows.extend(progs.iter().map(|(name, insns)| tracing_row(name, insns)));
                compile_set.extend(progs);
            }
            Err(e) => eprintln!("engines bench: skipping {}: {e}", o.display()),
        }
    }

    println!(
        "engines bench: {} rounds of about {} ms per engine and program",
        s.rounds,
        s.sample.as_millis()
    );
    measure(&mut rows, &s);
    report(
        "Execution time per run (median, thread CPU time) and ratio to native",
        &rows,
    );
    if !tracing_rows.is_empty() {
        measure(&mut tracing_rows, &s);
        report(
            "Tracing programs, one run with every helper stubbed to return 0 (median, thread \
             CPU time), ratio to our JIT's default",
            &tracing_rows,
        );
    }
    report_compile(&compile_set, &s);
    ExitCode::SUCCESS
}
