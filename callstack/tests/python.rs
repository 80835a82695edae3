//! Python frames in real interpreters: `tests/support/known_path.py` runs under every
//! CPython from 3.10 to 3.13 found on the machine and calls the capture (the `fold_here`
//! example, a cdylib) through ctypes and a small C library built here; each folded stack
//! it gets back must hold exactly the Python frames of the call, in order and at the
//! right lines, where the native frames of the evaluation loop were, between the native
//! frames around them.
//!
//! Interpreters are looked for in pyenv's versions, /usr/bin, /usr/local/bin and PATH
//! (`BPFTIME_TEST_PYTHONS`, paths separated by `:`, replaces the search); a version not
//! found is said to be skipped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/known_path.py");
const C_LIBRARY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/stack_test.c");

/// Interpreters to run, by the path given, with their version.
fn pythons() -> Vec<(PathBuf, (u8, u8))> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(list) = std::env::var("BPFTIME_TEST_PYTHONS") {
        candidates.extend(list.split(':').filter(|p| !p.is_empty()).map(PathBuf::from));
    } else {
        let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
        let pyenv = Path::new(&home).join(".pyenv/versions");
        let mut versions: Vec<PathBuf> = std::fs::read_dir(&pyenv)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        versions.sort();
        for minor in 10..=13 {
            let exe = format!("python3.{minor}");
            for v in &versions {
                candidates.push(v.join("bin").join(&exe));
            }
            for dir in ["/usr/bin", "/usr/local/bin"] {
                candidates.push(Path::new(dir).join(&exe));
            }
            if let Ok(path) = std::env::var("PATH") {
                candidates.extend(std::env::split_paths(&path).map(|d| d.join(&exe)));
            }
        }
    }
    let mut found: Vec<(PathBuf, (u8, u8))> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for c in candidates {
        if !c.exists() {
            continue;
        }
        // What runs (a pyenv shim is a script that runs one of the versions).
        let out = Command::new(&c)
            .args([
                "-c",
                "import os, sys; print(*sys.version_info[:2], os.path.realpath(sys.executable))",
            ])
            .output();
        let Some(out) = out.ok().filter(|o| o.status.success()) else {
            continue;
        };
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut words = text.split_whitespace();
        let (Some(major), Some(minor), Some(exe)) = (words.next(), words.next(), words.next())
        else {
            continue;
        };
        if !seen.insert(PathBuf::from(exe)) {
            continue;
        }
        if let (Ok(3), Ok(minor)) = (major.parse::<u8>(), minor.parse::<u8>()) {
            found.push((c, (3, minor)));
        }
    }
    found
}

/// The example cdylib cargo built beside this test (`cargo test` builds examples).
fn fold_here() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(Path::parent).unwrap();
    let lib = profile_dir.join("examples/libfold_here.so");
    assert!(
        lib.exists(),
        "{} is missing: `cargo test -p bpftime-callstack` builds it",
        lib.display()
    );
    lib
}

fn c_library() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("bpftime-callstack-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("libstack_test.so");
    let status = Command::new("cc")
        .args(["-O0", "-g", "-shared", "-fPIC", "-pthread", C_LIBRARY, "-o"])
        .arg(&lib)
        .status()
        .expect("a C compiler (cc)");
    assert!(status.success(), "cc failed on {C_LIBRARY}");
    lib
}

/// The lines of the script marked `# at: NAME`.
fn marked_lines() -> BTreeMap<String, u32> {
    std::fs::read_to_string(SCRIPT)
        .unwrap()
        .lines()
        .enumerate()
        .filter_map(|(i, line)| {
            let name = line.split("# at: ").nth(1)?;
            Some((name.trim().to_string(), i as u32 + 1))
        })
        .collect()
}

/// A frame as the folded stack shows a Python frame: `function (file:line)`, where the
/// file is a `.py` file or a `<...>` pseudo-file.
fn is_python(frame: &str) -> bool {
    let Some((_, rest)) = frame.rsplit_once(" (") else {
        return false;
    };
    let Some(inner) = rest.strip_suffix(')') else {
        return false;
    };
    let file = match inner.rsplit_once(':') {
        Some((f, line)) if line.bytes().all(|b| b.is_ascii_digit()) => f,
        _ => inner,
    };
    file.ends_with(".py") || file.starts_with('<')
}

/// The Python frames of a folded stack, and whether they come one after another.
fn python_part(folded: &str) -> (Vec<&str>, bool) {
    let frames: Vec<&str> = folded.split(';').collect();
    let at: Vec<usize> = (0..frames.len())
        .filter(|&i| is_python(frames[i]))
        .collect();
    let together = at.windows(2).all(|w| w[1] == w[0] + 1);
    (at.iter().map(|&i| frames[i]).collect(), together)
}

/// How the fold shows CPython's own view of a frame (`[name, file, line]`).
fn shown(frame: &Value) -> String {
    let name = frame[0].as_str().unwrap();
    let file = frame[1].as_str().unwrap();
    // The standard library is shown from its root, as the fold does.
    let file = match file.find("/lib/python3.") {
        Some(i) => file[i..].splitn(4, '/').nth(3).unwrap_or(file),
        None => file,
    };
    format!("{name} ({file}:{})", frame[2])
}

fn check(python: &Path, version: (u8, u8), out: &Value) -> Vec<String> {
    let mut bad = Vec::new();
    let lines = marked_lines();
    let who = format!("{} (3.{})", python.display(), version.1);
    let mut expect = |ok: bool, what: String| {
        if !ok {
            bad.push(format!("{who}: {what}"));
        }
    };
    expect(
        out["python"] == 300 + u64::from(version.1),
        format!("read as {} (300 + minor expected)", out["python"]),
    );
    let folded_line = lines["folded"];

    // The known path, exactly.
    let main = out["main_thread"].as_str().unwrap_or("");
    let (py, together) = python_part(main);
    let want: Vec<String> = ["<module>", "main", "outer", "middle", "inner", "folded"]
        .iter()
        .map(|f| format!("{f} ({SCRIPT}:{})", lines[*f]))
        .collect();
    expect(
        py == want,
        format!("main thread: Python frames {py:#?}, not {want:#?}"),
    );
    expect(
        together,
        format!("main thread: Python frames apart: {main}"),
    );
    let frames: Vec<&str> = main.split(';').collect();
    let first_py = frames.iter().position(|f| is_python(f)).unwrap_or(0);
    let last_py = frames.iter().rposition(|f| is_python(f)).unwrap_or(0);
    expect(
        frames[..first_py]
            .iter()
            .any(|f| *f == "Py_RunMain" || *f == "Py_BytesMain"),
        format!("main thread: the interpreter's main is not outside the Python frames: {main}"),
    );
    expect(
        frames.last() == Some(&"c_entry") && frames[last_py..].contains(&"ffi_call"),
        format!("main thread: ctypes' call into c_entry is not inside them: {main}"),
    );
    expect(
        !frames
            .iter()
            .any(|f| f.starts_with("_PyEval_EvalFrameDefault")),
        format!("main thread: a native frame of the evaluation loop is left: {main}"),
    );

    // A thread the C library started has no Python thread state: native frames only.
    let c = out["c_thread"].as_str().unwrap_or("");
    expect(
        python_part(c).0.is_empty() && c.ends_with(";c_thread_main") && !c.contains("c_entry"),
        format!("C thread: {c}"),
    );

    // Paths whose Python frames CPython itself reported at the call.
    for case in [
        "varied",
        "context",
        "generated",
        "deep",
        "thread",
        "real_thread_state",
    ] {
        let folded = out[case]["folded"].as_str().unwrap_or("");
        let (py, together) = python_part(folded);
        let mut want: Vec<String> = out[case]["expected"]
            .as_array()
            .map(|a| a.iter().map(shown).collect())
            .unwrap_or_default();
        if case != "real_thread_state" {
            want.push(format!("folded ({SCRIPT}:{folded_line})"));
        }
        expect(
            !want.is_empty() && py == want,
            format!("{case}: {py:#?}\nnot {want:#?}"),
        );
        expect(together, format!("{case}: Python frames apart: {folded}"));
    }

    // The line of every code unit of the code objects of a few standard modules, against
    // CPython's own co_lines().
    let tables = &out["line_tables"];
    expect(
        tables["units"].as_u64().unwrap_or(0) > 10_000 && tables["wrong"] == 0,
        format!("line tables: {tables}"),
    );

    // Thread states that are not: the call comes back, with native frames only.
    for r in out["garbage"].as_array().cloned().unwrap_or_default() {
        let folded = r[1].as_str().unwrap_or("");
        expect(
            r[0].as_i64().unwrap_or(-1) > 0 && python_part(folded).0.is_empty(),
            format!("garbage thread state: {r}"),
        );
    }
    bad
}

#[test]
fn python_frames_replace_the_evaluation_loop_in_every_version_here() {
    let fold_here = fold_here();
    let c_library = c_library();
    let pythons = pythons();
    let mut bad = Vec::new();
    let mut tested = Vec::new();
    for (python, version) in &pythons {
        if !(10..=13).contains(&version.1) {
            continue;
        }
        // Timing rounds: what a figure needs in an optimized build, a few in a debug one.
        let rounds = if cfg!(debug_assertions) { "20" } else { "3000" };
        let run = Command::new(python)
            .env("BPFTIME_CAPTURE_ROUNDS", rounds)
            .arg(SCRIPT)
            .arg(&fold_here)
            .arg(&c_library)
            .output()
            .unwrap();
        if !run.status.success() {
            bad.push(format!(
                "{}: {}\n{}",
                python.display(),
                run.status,
                String::from_utf8_lossy(&run.stderr)
            ));
            continue;
        }
        let out: Value = serde_json::from_slice(&run.stdout).unwrap();
        bad.extend(check(python, *version, &out));
        println!(
            "{} (3.{}): a capture at a depth of {} Python frames took {:.0} ns with them, \
             {:.0} ns with native frames only; their walk alone {:.0} ns{}",
            python.display(),
            version.1,
            out["bench_depth"],
            out["capture_ns_python"].as_f64().unwrap_or(0.0),
            out["capture_ns_native"].as_f64().unwrap_or(0.0),
            out["capture_ns_walk"].as_f64().unwrap_or(0.0),
            if cfg!(debug_assertions) {
                " (an unoptimized build: run with --release for figures)"
            } else {
                ""
            },
        );
        tested.push(version.1);
    }
    for minor in 10..=13 {
        if !tested.contains(&minor) {
            println!("skipped: no CPython 3.{minor} on this machine");
        }
    }
    std::fs::remove_dir_all(c_library.parent().unwrap()).ok();
    assert!(
        !tested.is_empty(),
        "no CPython 3.10 to 3.13 found (Debian 12 has /usr/bin/python3.11)"
    );
    assert!(bad.is_empty(), "{}", bad.join("\n\n"));
}
