//! `bpftime-trace-check TRACE.json [--launches N] [--gpu-lines N] [--spans NAME=N]...
//! [--tagged N]`: checks a `--trace` file (bpftime_tests::trace_check) and the counts a run
//! expects (`--tagged`: N lines say `tag=K`, each on the K-th launch), and
//! prints one line with what it found; exit 1 when a property fails, 2 on bad usage. The
//! GPU examples run it on the GPU machine, which has no Node for the test's consumer.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: bpftime-trace-check TRACE.json [--launches N] [--gpu-lines N] [--spans NAME=N]... [--tagged N]");
        return ExitCode::from(2);
    };
    let trace: serde_json::Value = match std::fs::read(path)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(v) => v,
        Err(e) => {
            eprintln!("bpftime-trace-check: {path}: {e}");
            return ExitCode::from(1);
        }
    };
    let mut r = bpftime_tests::trace_check::check(&trace);
    let mut rest = args[1..].iter();
    while let Some(flag) = rest.next() {
        let Some(value) = rest.next() else {
            eprintln!("bpftime-trace-check: {flag} needs a value");
            return ExitCode::from(2);
        };
        let want = |v: &str| v.parse::<usize>().ok();
        match flag.as_str() {
            "--launches" => match want(value) {
                Some(n) if n == r.launches && n == r.kernels && n == r.joined => {}
                Some(n) => r.problems.push(format!(
                    "{} launches, {} kernels, {} joined; {n} expected",
                    r.launches, r.kernels, r.joined
                )),
                None => return ExitCode::from(2),
            },
            "--gpu-lines" => match want(value) {
                Some(n) if n == r.gpu_lines && n == r.gpu_lines_inside => {}
                Some(n) => r.problems.push(format!(
                    "{} GPU lines, {} inside their kernels; {n} expected",
                    r.gpu_lines, r.gpu_lines_inside
                )),
                None => return ExitCode::from(2),
            },
            "--tagged" => {
                let Some(n) = want(value) else {
                    return ExitCode::from(2);
                };
                let (tagged, misplaced) = r.misplaced_tags();
                if tagged != n {
                    r.problems
                        .push(format!("{tagged} lines say a tag; {n} expected"));
                }
                r.problems.extend(misplaced);
            }
            "--spans" => {
                let Some((name, n)) = value.split_once('=').and_then(|(a, b)| Some((a, want(b)?)))
                else {
                    return ExitCode::from(2);
                };
                let got = r.cpu_spans.get(name).copied().unwrap_or(0);
                if got != n {
                    r.problems
                        .push(format!("{got} spans of {name}; {n} expected"));
                }
            }
            _ => {
                eprintln!("bpftime-trace-check: unknown option {flag}");
                return ExitCode::from(2);
            }
        }
    }
    let mut spans: Vec<String> = r
        .cpu_spans
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    spans.sort();
    println!(
        "{} launches, {} kernels, {} joined by flows; {} GPU lines, {} inside their kernels; \
         CPU spans {}; kernels start at most {} ns before their launch call (bound {} ns); {}",
        r.launches,
        r.kernels,
        r.joined,
        r.gpu_lines,
        r.gpu_lines_inside,
        spans.join(" "),
        r.worst_early_ns,
        r.bound_ns,
        if r.problems.is_empty() {
            "ok".to_string()
        } else {
            format!("problems: {}", r.problems.join("; "))
        }
    );
    if r.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
