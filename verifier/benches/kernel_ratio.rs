//! Verification time, ours against the kernel's, on the bundled example programs
//! (`bpf-examples/build/*.bpf.o`, built by `make -C bpf-examples`) and on the
//! largest and the costliest programs of the differential corpus:
//!
//! ```sh
//! make -C bpf-examples && cargo bench -p bpftime-verifier --bench kernel_ratio
//! ```
//!
//! Ours: the median wall time of `verify` over repeated runs. Kernel: the median
//! of the "verification time N usec" its log reports at `BPF_LOG_STATS`, and the
//! median wall time of the whole `BPF_PROG_LOAD` call, over repeated loads (root
//! and kernel eBPF needed; otherwise only our column is printed).

#[path = "../tests/oracle/mod.rs"]
mod oracle;

use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use bpftime_verifier::{verify, Options, ProgramInfo};
use oracle::{elf, kernel, Entry};

const KERNEL_LOADS: usize = 31;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn ours(e: &Entry) -> (u64, f64) {
    let maps = |imm: i32| e.map(imm);
    let info = ProgramInfo {
        insns: &e.insns,
        prog_type: e.prog_type,
        gpu: false,
        maps: &maps,
        mem_len: 0,
    };
    let opts = Options::default();
    let processed = match verify(&info, &opts) {
        Ok(v) => v.insns_processed,
        Err(r) => panic!("{} is rejected by our verifier:\n{}", e.name, r.log()),
    };
    // At least 31 runs and about 300 ms of them.
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 31
        || (start.elapsed() < Duration::from_millis(300) && times.len() < 100_000)
    {
        let t = Instant::now();
        black_box(verify(black_box(&info), &opts).is_ok());
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    (processed, median(times))
}

/// The kernel's "processed N insns" from a `LOG_STATS` log.
fn kernel_processed(log: &str) -> Option<u64> {
    log.lines().find_map(|l| {
        l.strip_prefix("processed ")?
            .split(' ')
            .next()?
            .parse()
            .ok()
    })
}

/// Instructions the kernel processed, and the medians of its own time figure and
/// of the syscall's wall time, in µs.
fn kernel_times(e: &Entry) -> Result<(u64, f64, f64), String> {
    let maps = kernel::create_maps(e)?;
    let insns = maps.patch(&e.insns);
    let fds = maps.fds();
    let (mut reported, mut wall, mut processed) = (Vec::new(), Vec::new(), 0);
    for _ in 0..KERNEL_LOADS {
        let l = kernel::load_with(e.prog_type, &insns, &fds, kernel::LOG_STATS, 1 << 16)
            .map_err(|r| format!("{} refused by the kernel: {}", e.name, r.last_line()))?;
        let usec = kernel::verification_usec(&l.log)
            .ok_or_else(|| format!("no verification time in the log of {}", e.name))?;
        processed = kernel_processed(&l.log).unwrap_or(0);
        reported.push(usec as f64);
        wall.push(l.elapsed.as_secs_f64() * 1e6);
    }
    Ok((processed, median(reported), median(wall)))
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut progs: Vec<Entry> = Vec::new();
    let build = root.join("../bpf-examples/build");
    let mut objects: Vec<_> = std::fs::read_dir(&build)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    objects.retain(|p: &std::path::PathBuf| p.to_string_lossy().ends_with(".bpf.o"));
    objects.sort();
    if objects.is_empty() {
        eprintln!(
            "no bpf-examples objects in {}: run `make -C bpf-examples` first",
            build.display()
        );
    }
    for obj in &objects {
        let bytes = std::fs::read(obj).unwrap();
        let stem = obj
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replace(".bpf.o", "");
        for p in elf::extract(&bytes).unwrap_or_else(|e| panic!("{}: {e}", obj.display())) {
            progs.push(Entry {
                name: format!("{stem}/{}", p.name),
                prog_type: bpftime_isa::uapi::prog_type::KPROBE,
                maps: p.maps,
                intent: None,
                insns: p.insns,
            });
        }
    }
    // The corpus's largest accepted program, and the one costliest to verify.
    let accepted: Vec<(Entry, u64)> = oracle::load_all()
        .into_iter()
        .filter_map(|e| {
            let maps = |imm: i32| e.map(imm);
            let info = ProgramInfo {
                insns: &e.insns,
                prog_type: e.prog_type,
                gpu: false,
                maps: &maps,
                mem_len: 0,
            };
            let v = verify(&info, &Options::default()).ok()?;
            Some((e, v.insns_processed))
        })
        .collect();
    // Mutants repeat their originals' size: look at the originals, first by name.
    let originals = || {
        accepted
            .iter()
            .filter(|(e, _)| !e.name.starts_with("mutations/"))
    };
    let largest = originals()
        .min_by_key(|(e, _)| (std::cmp::Reverse(e.insns.len()), e.name.clone()))
        .unwrap();
    let costliest = originals()
        .min_by_key(|(e, p)| (std::cmp::Reverse(*p), e.name.clone()))
        .unwrap();
    progs.push(largest.0.clone());
    if costliest.0.name != largest.0.name {
        progs.push(costliest.0.clone());
    }

    let why_not = kernel::unavailable();
    if let Some(why) = &why_not {
        eprintln!("kernel comparison skipped: {why}");
    }
    println!(
        "| program | insns | processed: ours | kernel | ours µs | kernel µs (log) | kernel µs (syscall) | kernel/ours |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for e in &progs {
        let (processed, us) = ours(e);
        match why_not
            .as_ref()
            .map_or_else(|| kernel_times(e), |w| Err(w.clone()))
        {
            Ok((k_processed, k_log, k_wall)) => println!(
                "| {} | {} | {processed} | {k_processed} | {us:.1} | {k_log:.0} | {k_wall:.0} | {:.1}x |",
                e.name,
                e.insns.len(),
                k_log / us
            ),
            Err(why) => {
                println!(
                    "| {} | {} | {processed} | - | {us:.1} | - | - | - |",
                    e.name,
                    e.insns.len()
                );
                if why_not.is_none() {
                    eprintln!("{why}");
                }
            }
        }
    }
}
