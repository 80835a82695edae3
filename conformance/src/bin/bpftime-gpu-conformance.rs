//! Runs the whole bpf_conformance suite on an NVIDIA GPU, then checks every GPU helper
//! in a multi-block launch.
//!
//! Each test is compiled to PTX, its kernel runs as one thread over a device copy of
//! the test's memory, and r0 must equal both the expected value and the interpreter's;
//! the memory after the run must equal the interpreter's too. A failed launch can leave
//! the CUDA context unusable, so the tests run in a worker process that this one
//! restarts after such a failure (or a crash, or a hang past `--timeout`), attributing
//! it to the test that caused it.
//!
//! Exit status: 0 when everything passed, 1 when anything failed, 2 when no GPU can be
//! used (the driver library is missing, say) or the suite cannot be read.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context};
use bpftime_conformance::gpu::{
    check_helper_records, conformance_ptx, helper_buffer, host_monotonic_ns, GpuDevice,
    GpuRunError, HostClockWindow, HELPER_LAUNCH, HELPER_PROBE, ONE_THREAD,
};
use bpftime_conformance::{
    parse_test, suite_files, test_name, Engine, Expectation, InterpreterEngine,
};
use bpftime_isa::asm::assemble;
use bpftime_jit_ptx::{PtxOptions, StandardGpuEnv};
use clap::Parser;

#[derive(Parser)]
#[command(about = "Runs the bpf_conformance suite and the GPU helper checks on an NVIDIA GPU")]
struct Args {
    /// Directory holding the bpf_conformance `.data` files.
    #[arg(long, env = "BPF_CONFORMANCE_DIR")]
    dir: PathBuf,
    /// Also write the report (summary and every failure) to this file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Seconds a single test may run before its worker is killed.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// Internal: run the tests from this index on in this process.
    #[arg(long, hide = true)]
    worker_from: Option<usize>,
    /// Internal: run the helper checks in this process.
    #[arg(long, hide = true)]
    helpers_worker: bool,
}

/// Worker exit status after a device failure: restart me after the reported test.
const POISONED: i32 = 3;
/// Worker exit status when there is no GPU to use.
const UNAVAILABLE: i32 = 2;

struct Failure {
    detail: String,
    poisoned: bool,
}

fn fail(detail: impl Into<String>) -> Failure {
    Failure {
        detail: detail.into(),
        poisoned: false,
    }
}

fn run_one(device: &GpuDevice, path: &Path) -> Result<(), Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| fail(format!("unreadable: {e}")))?;
    let case = parse_test(&test_name(path), &text).map_err(|e| fail(e.to_string()))?;
    let prog = assemble(&case.asm).map_err(|e| fail(format!("does not assemble: {e}")))?;
    let mut interpreter_mem = case.mem.clone();
    let interpreter = InterpreterEngine.run(&prog, &mut interpreter_mem);
    let ptx = match conformance_ptx(&prog, &PtxOptions::default()) {
        Ok(ptx) => ptx,
        // A refusal is what a test that expects an error wants.
        Err(_) if matches!(case.expect, Expectation::Error(_)) => return Ok(()),
        Err(e) => return Err(fail(format!("PTX compilation failed: {e}"))),
    };
    let mut gpu_mem = case.mem.clone();
    let r0 = device
        .launch(&ptx, &mut gpu_mem, ONE_THREAD)
        .map_err(|e| Failure {
            poisoned: matches!(e, GpuRunError::Device(_)),
            detail: e.to_string(),
        })?;
    match case.expect {
        Expectation::Value(want) if r0 != want => {
            return Err(fail(format!("r0 = {r0:#x}, expected {want:#x}")))
        }
        Expectation::Value(_) => {}
        Expectation::Error(ref e) => {
            return Err(fail(format!("returned {r0:#x}, expected an error ({e})")))
        }
    }
    match interpreter {
        Ok(v) if v != r0 => {
            return Err(fail(format!("r0 = {r0:#x}, the interpreter gives {v:#x}")))
        }
        Ok(_) => {}
        Err(e) => {
            return Err(fail(format!(
                "the interpreter failed ({e}), the GPU gave {r0:#x}"
            )))
        }
    }
    if let Some(at) = gpu_mem
        .iter()
        .zip(&interpreter_mem)
        .position(|(g, i)| g != i)
    {
        return Err(fail(format!(
            "memory after the run differs from the interpreter's at byte {at}: {:#04x} vs {:#04x}",
            gpu_mem[at], interpreter_mem[at]
        )));
    }
    Ok(())
}

fn open_device() -> GpuDevice {
    match GpuDevice::open() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("bpftime-gpu-conformance: {e}");
            std::process::exit(UNAVAILABLE);
        }
    }
}

fn clean(s: &str) -> String {
    s.replace(['\t', '\n'], " ")
}

/// Runs tests `from..` in this process, one `result` line each on stdout.
fn worker(files: &[PathBuf], from: usize) -> ExitCode {
    let device = open_device();
    let sms = device.sm_count().map_or("?".into(), |n| n.to_string());
    println!("device\t{}\t{sms}", clean(&device.name()));
    let mut out = std::io::stdout().lock();
    for (index, path) in files.iter().enumerate().skip(from) {
        let name = test_name(path);
        let outcome = run_one(&device, path);
        let (verdict, detail, poisoned) = match outcome {
            Ok(()) => ("pass", String::new(), false),
            Err(f) => ("fail", f.detail, f.poisoned),
        };
        let _ = writeln!(
            out,
            "result\t{index}\t{name}\t{verdict}\t{}",
            clean(&detail)
        );
        let _ = out.flush();
        if poisoned {
            // The context may be unusable; exit without running CUDA's teardown.
            std::process::exit(POISONED);
        }
    }
    ExitCode::SUCCESS
}

/// Runs the helper probe over a multi-block launch; one `helpers` line per problem.
fn helpers_worker() -> ExitCode {
    let device = open_device();
    let report = |verdict: &str, detail: &str| println!("helpers\t{verdict}\t{}", clean(detail));
    let prog = match assemble(HELPER_PROBE) {
        Ok(p) => p,
        Err(e) => {
            report("fail", &format!("helper probe does not assemble: {e}"));
            return ExitCode::SUCCESS;
        }
    };
    let ptx = match bpftime_jit_ptx::compile(&prog, &StandardGpuEnv, &PtxOptions::default()) {
        Ok(p) => p,
        Err(e) => {
            report("fail", &format!("helper probe does not compile: {e}"));
            return ExitCode::SUCCESS;
        }
    };
    let sms = match device.sm_count() {
        Ok(n) => n,
        Err(e) => {
            report("fail", &format!("SM count: {e}"));
            return ExitCode::SUCCESS;
        }
    };
    let mut mem = helper_buffer(&HELPER_LAUNCH);
    let loaded = match device.load(&ptx) {
        Ok(l) => l,
        Err(e) => {
            report("fail", &e.to_string());
            return ExitCode::SUCCESS;
        }
    };
    let clock = match device.clock() {
        Ok(c) => c,
        Err(e) => {
            report("fail", &format!("clock calibration: {e}"));
            return ExitCode::SUCCESS;
        }
    };
    let before_ns = host_monotonic_ns();
    let result = device.run(&loaded, &mut mem, HELPER_LAUNCH);
    let window = HostClockWindow {
        before_ns,
        after_ns: host_monotonic_ns(),
        offset_ns: clock.offset_ns,
        error_ns: clock.error_ns,
    };
    match result {
        Ok(0) => {
            let problems = check_helper_records(&mem, &HELPER_LAUNCH, sms, &window);
            if problems.is_empty() {
                report(
                    "pass",
                    &format!(
                        "ktime_get_ns on the host clock: global timer + {} ns, calibrated to \
                         within {} ns; the launch took {} ns",
                        clock.offset_ns,
                        clock.error_ns,
                        window.after_ns - window.before_ns
                    ),
                );
            }
            for p in problems {
                report("fail", &p);
            }
        }
        Ok(r0) => report("fail", &format!("r0 = {r0:#x}, expected 0")),
        Err(e) => report("fail", &e.to_string()),
    }
    ExitCode::SUCCESS
}

enum Event {
    Line(String),
    Exit,
}

/// Spawns `args` as a worker and streams its lines, then its exit status.
fn spawn_worker(args: &[String]) -> anyhow::Result<(mpsc::Receiver<Event>, std::process::Child)> {
    let exe = std::env::current_exe().context("finding this executable")?;
    let mut child = Command::new(exe)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting a worker")?;
    let stdout = child.stdout.take().context("worker stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(Event::Line(line)).is_err() {
                return;
            }
        }
        let _ = tx.send(Event::Exit);
    });
    Ok((rx, child))
}

fn main() -> ExitCode {
    let args = Args::parse();
    let files = match suite_files(&args.dir) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("bpftime-gpu-conformance: {e:#}");
            return ExitCode::from(2);
        }
    };
    if let Some(from) = args.worker_from {
        return worker(&files, from);
    }
    if args.helpers_worker {
        return helpers_worker();
    }
    match coordinate(&args, &files) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("bpftime-gpu-conformance: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn coordinate(args: &Args, files: &[PathBuf]) -> anyhow::Result<ExitCode> {
    let dir = args.dir.to_string_lossy().into_owned();
    let timeout = Duration::from_secs(args.timeout.max(1));
    let mut results: Vec<Option<Result<(), String>>> = vec![None; files.len()];
    let mut device = String::from("unknown");
    let mut next = 0;
    let mut restarts = 0;
    while next < files.len() {
        let (rx, mut child) = spawn_worker(&[
            "--dir".into(),
            dir.clone(),
            "--worker-from".into(),
            next.to_string(),
        ])?;
        let mut hung = false;
        loop {
            match rx.recv_timeout(timeout) {
                Ok(Event::Line(line)) => {
                    let f: Vec<&str> = line.splitn(5, '\t').collect();
                    match f.as_slice() {
                        ["device", name, sms] => device = format!("{name} ({sms} SMs)"),
                        ["result", index, _name, verdict, detail] => {
                            let i: usize = index.parse().context("worker's test index")?;
                            results[i] = Some(if *verdict == "pass" {
                                Ok(())
                            } else {
                                Err(detail.to_string())
                            });
                            next = i + 1;
                        }
                        _ => eprintln!("worker: {line}"),
                    }
                }
                Ok(Event::Exit) => break,
                Err(_) => {
                    hung = true;
                    let _ = child.kill();
                    break;
                }
            }
        }
        let status = child.wait().context("waiting for a worker")?;
        if hung {
            results[next] = Some(Err(format!(
                "no result within {} s; killed",
                timeout.as_secs()
            )));
            next += 1;
        } else {
            match status.code() {
                Some(0) => {
                    if next < files.len() {
                        bail!(
                            "a worker stopped at test {next} of {} without saying why",
                            files.len()
                        );
                    }
                }
                Some(UNAVAILABLE) => {
                    bail!("no GPU to run on (the worker said why above)");
                }
                Some(POISONED) => {}
                _ => {
                    results[next] = Some(Err(format!("the worker died ({status})")));
                    next += 1;
                }
            }
        }
        if next < files.len() {
            restarts += 1;
        }
    }

    let (rx, mut child) = spawn_worker(&["--dir".into(), dir, "--helpers-worker".into()])?;
    let mut helper_lines = Vec::new();
    loop {
        match rx.recv_timeout(timeout) {
            Ok(Event::Line(line)) => {
                if let Some(rest) = line.strip_prefix("helpers\t") {
                    helper_lines.push(rest.to_string());
                }
            }
            Ok(Event::Exit) => break,
            Err(_) => {
                let _ = child.kill();
                helper_lines.push(format!("fail\tno result within {} s", timeout.as_secs()));
                break;
            }
        }
    }
    let _ = child.wait();
    if helper_lines.is_empty() {
        helper_lines.push("fail\tthe helper worker reported nothing".into());
    }

    let passed = results.iter().filter(|r| matches!(r, Some(Ok(())))).count();
    let mut report = String::new();
    report.push_str(&format!("device: {device}\n"));
    for (path, r) in files.iter().zip(&results) {
        match r {
            Some(Ok(())) => {}
            Some(Err(e)) => report.push_str(&format!("FAIL {}: {e}\n", test_name(path))),
            None => report.push_str(&format!("FAIL {}: never ran\n", test_name(path))),
        }
    }
    let helpers_ok = helper_lines.iter().all(|l| l.starts_with("pass"));
    for l in &helper_lines {
        if let Some(problem) = l.strip_prefix("fail\t") {
            report.push_str(&format!("FAIL gpu helpers: {problem}\n"));
        }
        if let Some(detail) = l.strip_prefix("pass\t").filter(|d| !d.is_empty()) {
            report.push_str(&format!("gpu helpers: {detail}\n"));
        }
    }
    let failed = files.len() - passed;
    report.push_str(&format!(
        "gpu helpers (503 504 505 508 509 510 511 502 506, 5, 8 over {:?} blocks of {:?} threads): {}\n",
        HELPER_LAUNCH.grid_dim,
        HELPER_LAUNCH.block_dim,
        if helpers_ok { "pass" } else { "FAIL" }
    ));
    report.push_str(&format!(
        "bpf_conformance on the gpu engine: {passed} passed, {failed} failed ({} tests, {restarts} worker restarts)\n",
        files.len()
    ));
    print!("{report}");
    if let Some(out) = &args.out {
        std::fs::write(out, &report).with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(if failed == 0 && helpers_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
