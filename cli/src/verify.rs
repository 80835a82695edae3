//! `bpftime verify prog.bpf.o [--prog NAME] [-v]`: the verifier on its own.
//! libbpf loads the object through the shim, as `bpftime run` does, into a
//! throwaway store, one program at a time so that every program gets its own
//! verdict: `NAME: ok (N insns processed)`, or the verifier's kernel-style log.
//!
//! Exit status: 0 when every program is accepted, 1 when any is rejected,
//! 2 for a file that is not a BPF object or an unknown `--prog`.

use crate::inproc;
use anyhow::{anyhow, Result};
use libbpf_rs::{AsRawLibbpf, ObjectBuilder, PrintLevel};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;

/// Room for the longest log we expect (level 2 on a large program).
const LOG_SIZE: usize = 16 << 20;

#[derive(clap::Args)]
pub struct VerifyArgs {
    /// Check only this program (default: every program libbpf would load).
    #[arg(long, value_name = "NAME")]
    prog: Option<String>,
    /// Print the verifier's full log (level 2) for accepted programs too.
    #[arg(short, long)]
    verbose: bool,
    /// The eBPF object (`clang -target bpf -g -c prog.bpf.c`).
    object: PathBuf,
}

/// `bpftime verify`: runs the loader with the shim in a store of its own,
/// removed afterwards.
pub fn main(args: VerifyArgs) -> ExitCode {
    if let Err(e) = inproc::check_object(&args.object) {
        errln!("bpftime verify: {e:#}");
        return ExitCode::from(2);
    }
    let store = format!("verify-{}", std::process::id());
    let mut argv: Vec<OsString> = vec!["__verify-loader".into()];
    if let Some(p) = &args.prog {
        argv.push("--prog".into());
        argv.push(p.into());
    }
    if args.verbose {
        argv.push("--verbose".into());
    }
    argv.push(args.object.into_os_string());
    let _cleanup = match inproc::StoreCleanup::create(&store) {
        Ok(c) => c,
        Err(e) => {
            errln!("bpftime verify: {e:#}");
            return ExitCode::from(2);
        }
    };
    match inproc::run_with_shim(&store, &argv) {
        Ok(status) => inproc::exit_code(status),
        Err(e) => {
            errln!("bpftime verify: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// libbpf's messages during the current load, shown when a load fails
/// before the verifier ran (a bad relocation, a map that cannot be made).
static LIBBPF_MESSAGES: Mutex<String> = Mutex::new(String::new());

fn collect_libbpf_message(level: PrintLevel, msg: &str) {
    if !matches!(level, PrintLevel::Debug) {
        LIBBPF_MESSAGES
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_str(msg);
    }
}

enum Verdict {
    /// A map of the object cannot be made, so no program was checked.
    MapRefused {
        error: String,
    },
    Accepted {
        log: String,
    },
    Rejected {
        log: String,
        error: String,
        libbpf: String,
    },
}

/// The number in the verifier's `processed N insns` line.
fn insns_processed(log: &str) -> Option<u64> {
    log.lines().find_map(|l| {
        let rest = &l[l.find("processed ")? + "processed ".len()..];
        let (n, tail) = rest.split_once(' ')?;
        tail.starts_with("insns").then(|| n.parse().ok()).flatten()
    })
}

/// Why a map of `open` cannot be made, for a map too big for bpftime's store (which
/// the loader would report as E2BIG, "Argument list too long", as if the program were
/// at fault): `map `NAME`: the reason with the limit`.
fn oversized_map(open: &libbpf_rs::OpenObject) -> Option<String> {
    open.maps().filter(|m| m.autocreate()).find_map(|m| {
        let spec = bpftime_runtime::MapSpec {
            map_type: m.map_type() as u32,
            key_size: m.key_size(),
            value_size: m.value_size(),
            max_entries: m.max_entries(),
            map_flags: m.map_flags(),
            name: m.name().to_string_lossy().into_owned(),
            ..Default::default()
        };
        match bpftime_runtime::Map::check_spec(&spec) {
            Err(e) if e.errno() == libc::E2BIG => Some(format!(
                "map `{}` ({} entries of {} bytes) cannot be made: {e}",
                spec.name, spec.max_entries, spec.value_size
            )),
            _ => None,
        }
    })
}

/// Loads `object` with only `prog` enabled and the verifier's log captured.
fn verify_one(object: &Path, prog: &str, log_level: u32) -> Result<Verdict> {
    let mut open = ObjectBuilder::default()
        .open_file(object)
        .map_err(|e| anyhow!("cannot open {}: {e}", object.display()))?;
    let mut log = vec![0u8; LOG_SIZE];
    for mut p in open.progs_mut() {
        let this = p.name().to_string_lossy() == prog;
        p.set_autoload(this);
        if this {
            p.set_log_level(log_level);
            let raw = p.as_libbpf_object().as_ptr();
            // SAFETY: `raw` is a program of `open`, and `log` outlives the
            // load below, the only time libbpf writes to it.
            unsafe {
                libbpf_rs::libbpf_sys::bpf_program__set_log_buf(
                    raw,
                    log.as_mut_ptr().cast(),
                    log.len() as _,
                )
            };
        }
    }
    let too_big = oversized_map(&open);
    LIBBPF_MESSAGES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clear();
    let loaded = open.load();
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    let text = String::from_utf8_lossy(&log[..end]).into_owned();
    Ok(match loaded {
        Ok(_) => Verdict::Accepted { log: text },
        // The load stopped at a map, not at the program.
        Err(_) if text.trim().is_empty() && too_big.is_some() => Verdict::MapRefused {
            error: too_big.unwrap_or_default(),
        },
        Err(e) => Verdict::Rejected {
            log: text,
            error: e.to_string(),
            libbpf: std::mem::take(&mut *LIBBPF_MESSAGES.lock().unwrap_or_else(|p| p.into_inner())),
        },
    })
}

/// The loader, inside the shim.
pub fn loader_main(args: VerifyArgs) -> ExitCode {
    if let Err(e) = inproc::enter_loader() {
        errln!("bpftime: {e:#}");
        return ExitCode::from(2);
    }
    bpftime_libbpf_print::set(Some((PrintLevel::Info, collect_libbpf_message)));
    let names: Vec<String> = match ObjectBuilder::default().open_file(&args.object) {
        Ok(open) => open
            .progs()
            .filter(|p| p.autoload())
            .map(|p| p.name().to_string_lossy().into_owned())
            .collect(),
        Err(e) => {
            let libbpf = LIBBPF_MESSAGES
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            err!("{libbpf}");
            errln!("bpftime verify: cannot open {}: {e}", args.object.display());
            return ExitCode::from(2);
        }
    };
    let chosen = match &args.prog {
        Some(p) if names.contains(p) => vec![p.clone()],
        Some(p) => {
            errln!(
                "bpftime verify: {} has no program `{p}`; it has: {}",
                args.object.display(),
                names.join(", ")
            );
            return ExitCode::from(2);
        }
        None if names.is_empty() => {
            errln!(
                "bpftime verify: {} holds no programs",
                args.object.display()
            );
            return ExitCode::from(2);
        }
        None => names,
    };
    let level = if args.verbose { 2 } else { 1 };
    let mut rejected = 0;
    for name in &chosen {
        match verify_one(&args.object, name, level) {
            Ok(Verdict::Accepted { log }) => {
                match insns_processed(&log) {
                    Some(n) => outln!("{name}: ok ({n} insns processed)"),
                    None => outln!("{name}: ok"),
                }
                if args.verbose {
                    out!("{log}");
                    if !log.ends_with('\n') {
                        outln!();
                    }
                }
            }
            Ok(Verdict::MapRefused { error }) => {
                errln!("bpftime verify: {}: {error}", args.object.display());
                return ExitCode::from(2);
            }
            Ok(Verdict::Rejected { log, error, libbpf }) => {
                rejected += 1;
                outln!("{name}: rejected ({error})");
                if log.trim().is_empty() {
                    // Nothing reached the verifier: libbpf's own account is the reason.
                    out!("{libbpf}");
                } else {
                    out!("{log}");
                    if !log.ends_with('\n') {
                        outln!();
                    }
                }
            }
            Err(e) => {
                errln!("bpftime verify: {e:#}");
                return ExitCode::from(2);
            }
        }
    }
    if rejected > 0 {
        outln!("{rejected} of {} programs rejected", chosen.len());
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::insns_processed;

    #[test]
    fn finds_the_count() {
        assert_eq!(
            insns_processed(
                "0: (b7) r0 = 0\nprocessed 12 insns, 0 states, 0 pruned; stack depth 0\n"
            ),
            Some(12)
        );
        assert_eq!(
            insns_processed("processed 7 insns (limit 1000000) max_states_per_insn 0"),
            Some(7)
        );
        assert_eq!(insns_processed("nothing here"), None);
    }
}
