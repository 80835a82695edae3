//! Regenerates the generated parts of the differential corpus (`corpus/clang`,
//! `corpus/mutations`) from their sources:
//!
//! ```sh
//! cargo run --release -p bpftime-verifier --example corpus_gen
//! ```
//!
//! `corpus/clang`: every program of the tool-like C programs in `corpus/c`, the
//! verifier's own C test programs (`tests/bpf`) and the bpf-examples, each built
//! by clang-19 at `-O2` for `-mcpu=v1`..`v4`, linked and relocated as libbpf
//! would. `corpus/mutations`: one deterministic mutation of every program meant
//! to pass (hand-written `_ok` rules and the clang set).

#[path = "../tests/oracle/mod.rs"]
mod oracle;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};
use oracle::{elf, mutate, Entry};

const CLANG: &str = "clang-19";
const CPUS: [&str; 4] = ["v1", "v2", "v3", "v4"];

fn sources(root: &Path) -> Result<Vec<(String, PathBuf, Vec<String>)>> {
    let mut out = Vec::new();
    let mut add = |set: &str, dir: PathBuf, suffix: &str, includes: Vec<String>| -> Result<()> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()?;
        files.retain(|p| p.to_string_lossy().ends_with(suffix));
        files.sort();
        for f in files {
            let file = f.file_name().unwrap().to_string_lossy().to_string();
            let stem = file.trim_end_matches(suffix).to_string();
            out.push((format!("{set}-{stem}"), f, includes.clone()));
        }
        Ok(())
    };
    add("tool", root.join("corpus/c"), ".c", vec![])?;
    add("vtest", root.join("tests/bpf"), ".c", vec![])?;
    let examples = root.join("../bpf-examples");
    for ex in ["funclatency", "malloc_count", "ringbuf_events"] {
        let dir = examples.join(ex);
        let include = format!("-I{}", dir.display());
        add("example", dir, ".bpf.c", vec![include])?;
    }
    Ok(out)
}

fn compile(src: &Path, cpu: &str, includes: &[String]) -> Result<(Vec<u8>, String)> {
    let out = std::env::temp_dir().join(format!("corpus-gen-{}.o", std::process::id()));
    let mut args: Vec<String> = [
        "-g",
        "-O2",
        "-target",
        "bpf",
        "-D__TARGET_ARCH_x86",
        "-I/usr/include/x86_64-linux-gnu",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(format!("-mcpu={cpu}"));
    args.extend(includes.iter().cloned());
    args.push("-c".into());
    let run = Command::new(CLANG)
        .args(&args)
        .arg(src)
        .arg("-o")
        .arg(&out)
        .output()
        .with_context(|| format!("running {CLANG} (install it with: apt-get install clang-19)"))?;
    if !run.status.success() {
        let why = String::from_utf8_lossy(&run.stderr);
        let first = why.lines().find(|l| l.contains("error")).unwrap_or("");
        bail!(
            "{CLANG} failed on {} for -mcpu={cpu}: {first}",
            src.display()
        );
    }
    let bytes = std::fs::read(&out)?;
    std::fs::remove_file(&out)?;
    let shown: Vec<String> = args
        .iter()
        .filter(|a| !a.starts_with("-I/"))
        .cloned()
        .collect();
    Ok((bytes, format!("{CLANG} {}", shown.join(" "))))
}

fn clear(dir: &Path) -> Result<()> {
    if dir.exists() {
        for e in std::fs::read_dir(dir)? {
            let p = e?.path();
            if p.extension().is_some_and(|x| x == "s") {
                std::fs::remove_file(p)?;
            }
        }
    }
    std::fs::create_dir_all(dir)?;
    Ok(())
}

fn run() -> Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let corpus = oracle::corpus_dir();
    let clang_dir = corpus.join("clang");
    clear(&clang_dir)?;
    let mut written = 0;
    for (label, src, includes) in sources(&root)? {
        let workspace = root.parent().unwrap().canonicalize()?;
        let full = src.canonicalize()?;
        let rel = full
            .strip_prefix(&workspace)
            .unwrap_or(&full)
            .display()
            .to_string();
        for cpu in CPUS {
            let (bytes, cmd) = match compile(&src, cpu, &includes) {
                Ok(x) => x,
                Err(e) => {
                    // Some sources need a newer ISA (signed division needs v4).
                    eprintln!("note: {e:#}; skipped");
                    continue;
                }
            };
            for p in elf::extract(&bytes).map_err(anyhow::Error::msg)? {
                let prog = if p.name.is_empty() {
                    p.section.replace('/', "_")
                } else {
                    p.name.clone()
                };
                let name = format!("clang/{label}-{cpu}-{prog}");
                let e = Entry {
                    name: name.clone(),
                    prog_type: bpftime_isa::uapi::prog_type::KPROBE,
                    maps: p.maps,
                    intent: None,
                    insns: p.insns,
                };
                let header = vec![
                    format!("program `{}` (section {}) of {rel}", p.name, p.section),
                    format!("built with: {cmd} {rel}"),
                    "generated by: cargo run --release -p bpftime-verifier --example corpus_gen"
                        .to_string(),
                ];
                std::fs::write(corpus.join(format!("{name}.s")), oracle::print(&e, &header))?;
                written += 1;
            }
        }
    }
    eprintln!("{written} clang-built programs");

    let mut_dir = corpus.join("mutations");
    clear(&mut_dir)?;
    let mut n = 0;
    for base in oracle::load_all() {
        for (e, what) in mutate::corpus_mutants(&base) {
            let header = vec![
                format!("mutation of {}: {what}", base.name),
                "generated by: cargo run --release -p bpftime-verifier --example corpus_gen"
                    .to_string(),
            ];
            std::fs::write(
                corpus.join(format!("{}.s", e.name)),
                oracle::print(&e, &header),
            )?;
            n += 1;
        }
    }
    eprintln!("{n} mutations");
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
