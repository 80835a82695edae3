//! The plugin speaks the bpf_conformance runner's protocol: program hex on stdin, memory hex
//! as the first argument, r0 in hex on stdout, non-zero exit with a message on failure.

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn plugin(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_bpf-conformance-plugin"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the plugin starts");
    let written = child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(stdin.as_bytes());
    // A plugin that rejects its arguments may exit before reading its program.
    if let Err(e) = written {
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::BrokenPipe,
            "the plugin reads its program: {e}"
        );
    }
    child.wait_with_output().expect("the plugin exits")
}

#[test]
fn prints_r0_in_hex_for_a_program_reading_its_memory() {
    // ldxw r0, [r1]; add r0, r2; exit
    let prog = "6110000000000000 0f20000000000000 9500000000000000\n";
    for engine in ["interpreter", "jit"] {
        let out = plugin(&["11223344", "--engine", engine], prog);
        assert!(
            out.status.success(),
            "{engine}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "44332215");
    }
}

#[test]
fn the_jit_engine_refuses_a_faulting_program_instead_of_running_it() {
    // ldxw r0, [r1+4] with 4 bytes of memory: out of bounds.
    let out = plugin(
        &["11223344", "--engine", "jit"],
        "6110040000000000 9500000000000000",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty());
    assert!(stderr.contains("checked interpreter"), "{stderr}");
}

#[test]
fn runs_without_memory() {
    // mov r0, -256; exit
    let out = plugin(&[], "b700000000ffffff9500000000000000");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ffffffffffffff00"
    );
}

#[test]
fn fails_with_a_message_when_the_program_faults_or_the_input_is_bad() {
    // ldxw r0, [r1+4] with 4 bytes of memory: out of bounds.
    let out = plugin(&["11223344"], "6110040000000000 9500000000000000");
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert!(!out.stderr.is_empty());

    let out = plugin(&[], "b70000");
    assert_eq!(out.status.code(), Some(2));

    let out = plugin(&["--engine", "warp-drive"], "9500000000000000");
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn the_gpu_engine_runs_on_a_gpu_or_says_why_not() {
    // ldxw r0, [r1]; add r0, r2; exit
    let prog = "6110000000000000 0f20000000000000 9500000000000000\n";
    let out = plugin(&["11223344", "--engine", "gpu"], prog);
    let stderr = String::from_utf8_lossy(&out.stderr);
    match bpftime_conformance::gpu::check_libcuda() {
        Ok(()) => {
            assert!(out.status.success(), "{stderr}");
            assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "44332215");
        }
        Err(why) => {
            eprintln!("no GPU here ({why}); checking the refusal");
            // A clear message and exit status 1, not cudarc's panic (101).
            assert_eq!(out.status.code(), Some(1), "{stderr}");
            assert!(stderr.contains("libcuda.so.1"), "{stderr}");
            assert!(out.stdout.is_empty());
        }
    }
}
