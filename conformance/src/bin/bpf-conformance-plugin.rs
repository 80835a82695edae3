//! A plugin for the bpf_conformance runner: the program's bytes in hex on stdin, the memory
//! in hex as the first argument; prints r0 in hex, or exits non-zero with the reason.

use std::io::Read;
use std::process::ExitCode;

use anyhow::{bail, Context};
use bpftime_conformance::{engine, EngineKind};
use clap::Parser;

#[derive(Parser)]
#[command(about = "Runs one eBPF program for the bpf_conformance runner")]
struct Args {
    /// The memory the program gets in r1 (length in r2), as hex bytes.
    memory: Option<String>,
    /// Which engine runs the program.
    #[arg(long, default_value = "interpreter")]
    engine: EngineKind,
}

fn hex_bytes(text: &str) -> anyhow::Result<Vec<u8>> {
    let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if !digits.len().is_multiple_of(2) {
        bail!("odd number of hex digits ({})", digits.len());
    }
    digits
        .chunks(2)
        .map(|pair| {
            let s = std::str::from_utf8(pair).context("not ASCII")?;
            u8::from_str_radix(s, 16).with_context(|| format!("`{s}` is not a hex byte"))
        })
        .collect()
}

fn main() -> ExitCode {
    let args = Args::parse();
    let input = (|| -> anyhow::Result<_> {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading the program from stdin")?;
        let prog = bpftime_isa::decode(&hex_bytes(&text).context("program on stdin")?)?;
        let mem = hex_bytes(args.memory.as_deref().unwrap_or("")).context("memory argument")?;
        Ok((prog, mem))
    })();
    let (prog, mut mem) = match input {
        Ok(v) => v,
        Err(e) => {
            eprintln!("bpf-conformance-plugin: {e:#}");
            return ExitCode::from(2);
        }
    };
    match engine(args.engine).run(&prog, &mut mem) {
        Ok(r0) => {
            println!("{r0:x}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bpf-conformance-plugin: {e}");
            ExitCode::from(1)
        }
    }
}
