//! Nothing reaches the kernel's eBPF behind the user's back, and our faults never take
//! the application down.
//!
//! Every process of these tests runs under a seccomp filter that kills it on `bpf(2)` and
//! `perf_event_open(2)`: the commands must do all their work (load, start, run, verify,
//! attach) without either, and a store that cannot be opened must fail the loader's calls
//! rather than pass them on to the kernel. As root the kernel would have served them, so
//! a pass-through would not show up as an error: only the filter catches it.

use bpftime_tests::{examples, field, run_with_timeout, Session, Tool};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Installs, in the child about to exec, a filter that kills the process on `bpf` or
/// `perf_event_open`.
fn kill_on_kernel_ebpf(c: &mut Command) -> &mut Command {
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
    const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
    let ld_abs = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    let jeq = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    let ret = (libc::BPF_RET | libc::BPF_K) as u16;
    let insn = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let filter = [
        // arch (seccomp_data.arch at offset 4): anything but x86-64 is let through.
        insn(ld_abs, 0, 0, 4),
        insn(jeq, 0, 3, AUDIT_ARCH_X86_64),
        // nr (offset 0)
        insn(ld_abs, 0, 0, 0),
        insn(jeq, 2, 0, libc::SYS_bpf as u32),
        insn(jeq, 1, 0, libc::SYS_perf_event_open as u32),
        insn(ret, 0, 0, SECCOMP_RET_ALLOW),
        insn(ret, 0, 0, SECCOMP_RET_KILL_PROCESS),
    ];
    // SAFETY: runs in the forked child before exec and only makes two prctl calls on
    // memory this closure owns (async-signal-safe).
    unsafe {
        c.pre_exec(move || {
            let prog = libc::sock_fprog {
                len: filter.len() as u16,
                filter: filter.as_ptr() as *mut libc::sock_filter,
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &prog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Fails the test if the process died of the filter (SIGSYS): it called the kernel.
fn assert_not_killed_by_filter(what: &str, out: &Output) {
    assert_ne!(
        out.status.signal(),
        Some(libc::SIGSYS),
        "{what} made a real bpf() or perf_event_open() call (killed by the seccomp filter)\n\
         stdout: {}\nstderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// The filter itself: a program that does call the kernel's eBPF dies of it.
#[test]
fn the_filter_kills_a_real_bpf_call() {
    let mut c = Command::new("bpftool");
    c.args(["prog", "list"]);
    kill_on_kernel_ebpf(&mut c);
    let out = match c.output() {
        Ok(out) => out,
        Err(e) => {
            eprintln!("skipped: bpftool cannot run ({e}); scripts/setup.sh installs it");
            return;
        }
    };
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGSYS),
        "bpftool under the filter: {:?} {}",
        out.status,
        text(&out.stderr)
    );
}

#[test]
fn load_and_start_serve_a_libbpf_tool_without_the_kernel() {
    const N: u64 = 200;
    let s = Session::new("fc-load");
    let target = s.target_copy(examples::CALLS);
    let target = target.to_str().unwrap();
    let mut c = s.bpftime();
    c.args([
        "load",
        examples::FUNCLATENCY,
        "--target",
        target,
        "--func",
        "work",
    ]);
    kill_on_kernel_ebpf(&mut c);
    let loader = Tool::spawn(c);
    let mut c = s.bpftime();
    c.args(["start", target, &N.to_string()]);
    kill_on_kernel_ebpf(&mut c);
    let out = run_with_timeout(c, Duration::from_secs(60));
    assert_not_killed_by_filter("bpftime start", &out);
    assert!(out.status.success(), "target failed: {}", text(&out.stderr));
    let (code, lines, err) = loader.stop();
    assert_ne!(
        code,
        128 + libc::SIGSYS,
        "the loader called the kernel: {err}"
    );
    assert_eq!(code, 0, "loader failed: {err}");
    assert_eq!(field(&lines, "count=", "count"), Some(N), "{lines:?}");
}

#[test]
fn run_and_verify_work_without_the_kernel() {
    let s = Session::new("fc-run");
    let target = s.target_copy(examples::CALLS);
    let mut c = s.bpftime();
    c.args(["run", examples::FUNCLATENCY_BPF_O, "--"])
        .arg(&target)
        .arg("50");
    kill_on_kernel_ebpf(&mut c);
    let out = run_with_timeout(c, Duration::from_secs(120));
    assert_not_killed_by_filter("bpftime run", &out);
    assert!(out.status.success(), "run failed: {}", text(&out.stderr));

    for object in [examples::FUNCLATENCY_BPF_O, examples::REJECTED_BPF_O] {
        let mut c = s.bpftime();
        c.args(["verify", object]);
        kill_on_kernel_ebpf(&mut c);
        let out = run_with_timeout(c, Duration::from_secs(120));
        assert_not_killed_by_filter("bpftime verify", &out);
        let want = if object == examples::REJECTED_BPF_O {
            1
        } else {
            0
        };
        assert_eq!(
            out.status.code(),
            Some(want),
            "verify {object}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
}

#[test]
fn attach_injects_without_the_kernel() {
    const N: u64 = 100;
    let s = Session::new("fc-attach");
    let exe = s.target_copy(examples::CALLS);
    let mut c = s.bpftime();
    c.args(["load", examples::FUNCLATENCY, "--target"])
        .arg(&exe)
        .args(["--func", "work"]);
    kill_on_kernel_ebpf(&mut c);
    let loader = Tool::spawn(c);
    let go = s.tmp.join("go");
    let mut c = Command::new(&exe);
    c.arg(N.to_string())
        .arg("--wait-for")
        .arg(&go)
        .env_remove("BPFTIME_STORE")
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    kill_on_kernel_ebpf(&mut c);
    let mut target = c.spawn().expect("spawn target");
    let pid = target.id();
    let end = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| m.contains("libc.so"))
    {
        assert!(Instant::now() < end, "target never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    let mut c = s.bpftime();
    c.arg("attach").arg(pid.to_string());
    kill_on_kernel_ebpf(&mut c);
    let out = run_with_timeout(c, Duration::from_secs(60));
    assert_not_killed_by_filter("bpftime attach", &out);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    std::fs::write(&go, "").unwrap();
    let status = target.wait().unwrap();
    assert_ne!(
        status.signal(),
        Some(libc::SIGSYS),
        "the attached agent called the kernel"
    );
    assert_eq!(status.code(), Some(0));
    let (code, lines, err) = loader.stop();
    assert_eq!(code, 0, "loader failed: {err}");
    assert_eq!(field(&lines, "count=", "count"), Some(N), "{lines:?}");
}

/// A loader whose store cannot be opened gets errors for its eBPF calls, with one line
/// saying why: nothing goes to the kernel in our place.
#[test]
fn a_store_that_cannot_be_opened_fails_the_loaders_calls() {
    let s = Session::new("fc-bad-store");
    // A store whose header is garbage.
    let made = s.bpftime().args(["load", "true"]).output().unwrap();
    assert!(made.status.success(), "{}", text(&made.stderr));
    let header = bpftime_runtime::Store::dir_for(&s.store).join("store");
    std::fs::write(&header, vec![0xa5u8; 4096]).unwrap();
    // `bpftime load` refuses such a store itself; a user may also preload the shim by
    // hand, and then the shim is what must refuse.
    let refused = s
        .bpftime()
        .args(["load", examples::FUNCLATENCY])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused.stderr));
    let target = s.target_copy(examples::CALLS);
    let mut c = Command::new(examples::FUNCLATENCY);
    c.arg("--target")
        .arg(&target)
        .args(["--func", "work"])
        .env(
            "LD_PRELOAD",
            bpftime_tests::build_dir().join("libbpftime_syscall_shim.so"),
        )
        .env("BPFTIME_STORE", &s.store);
    kill_on_kernel_ebpf(&mut c);
    let out = run_with_timeout(c, Duration::from_secs(60));
    assert_not_killed_by_filter("a loader in a damaged store", &out);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "the loader should fail: {err}");
    assert!(
        err.contains("cannot open the store") && err.contains("nothing is passed to the kernel"),
        "one line must say why: {err}"
    );
}

/// `run` with a store name it cannot use fails before libbpf loads anything.
#[test]
fn run_with_a_bad_store_name_fails_before_loading() {
    let s = Session::new("fc-bad-name");
    let mut c = Command::new(bpftime_tests::bpftime());
    let target = s.target_copy(examples::CALLS);
    c.args(["--store", "../x", "run", examples::FUNCLATENCY_BPF_O, "--"])
        .arg(&target)
        .arg("10");
    kill_on_kernel_ebpf(&mut c);
    let out = run_with_timeout(c, Duration::from_secs(60));
    assert_not_killed_by_filter("bpftime run with a bad store name", &out);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("store name"),
        "{}",
        text(&out.stderr)
    );
    drop(s);
}

/// A panic inside an interposer fails that call (errno) and leaves the tool running; a
/// panic in the starter leaves the target running, uninstrumented.
#[test]
fn a_panic_in_our_code_never_takes_the_process_down() {
    let s = Session::new("fc-panic");
    let target = s.target_copy(examples::CALLS);
    let mut c = s.bpftime();
    c.args(["load", examples::FUNCLATENCY, "--target"])
        .arg(&target)
        .args(["--func", "work"])
        .env(bpftime_ffi_guard::INJECT_PANIC_ENV, "bpf");
    let out = run_with_timeout(c, Duration::from_secs(60));
    let err = text(&out.stderr);
    assert_eq!(
        out.status.signal(),
        None,
        "the loader died of a signal: {err}"
    );
    assert!(
        !out.status.success(),
        "its eBPF calls should have failed: {err}"
    );
    assert!(
        err.contains("internal error in bpf"),
        "the panic is reported once: {err}"
    );
    assert_eq!(
        err.matches("bpftime: internal error in bpf").count(),
        1,
        "{err}"
    );

    let mut c = s.bpftime();
    c.arg("start")
        .arg(&target)
        .arg("10")
        .env(bpftime_ffi_guard::INJECT_PANIC_ENV, "the agent starter");
    let out = run_with_timeout(c, Duration::from_secs(60));
    let err = text(&out.stderr);
    assert!(out.status.success(), "the target must run on: {err}");
    assert!(err.contains("internal error in the agent starter"), "{err}");
    assert!(
        Path::new(&target).exists(),
        "the target ran from its own file"
    );
}

/// A statically linked tool cannot have the shim preloaded: under `bpftime load` its
/// `bpf()` calls would go to the kernel. `load` refuses it (and a script whose
/// interpreter is one) before running anything, with one line naming it.
#[test]
fn load_refuses_a_statically_linked_tool() {
    let s = Session::new("fc-static");
    let src = s.tmp.join("static_tool.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <unistd.h>\n#include <sys/syscall.h>\n#include <linux/bpf.h>\n\
         int main(void) {\n\
             union bpf_attr a = { .map_type = BPF_MAP_TYPE_ARRAY, .key_size = 4,\n\
                                  .value_size = 8, .max_entries = 1 };\n\
             long fd = syscall(SYS_bpf, BPF_MAP_CREATE, &a, sizeof(a));\n\
             printf(\"the tool ran: bpf() gave %ld\\n\", fd);\n\
             return 0;\n\
         }\n",
    )
    .unwrap();
    let tool = s.tmp.join("static_tool");
    let cc = Command::new("gcc")
        .args(["-static", "-O1", "-o"])
        .arg(&tool)
        .arg(&src)
        .output()
        .expect("gcc");
    assert!(cc.status.success(), "gcc -static: {}", text(&cc.stderr));
    let script = s.tmp.join("static_script");
    std::fs::write(&script, format!("#!{}\n", tool.display())).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    for (given, named) in [(&tool, &tool), (&script, &tool)] {
        let out = kill_on_kernel_ebpf(s.bpftime().arg("load").arg(given))
            .output()
            .unwrap();
        assert_not_killed_by_filter("bpftime load of a static tool", &out);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        assert!(
            !text(&out.stdout).contains("the tool ran"),
            "the static tool ran: {}",
            text(&out.stdout)
        );
        let err = text(&out.stderr);
        assert!(
            err.starts_with(&format!("bpftime: {} ", named.display()))
                && err.contains("is statically linked")
                && err.contains("would reach the kernel's eBPF"),
            "{err}"
        );
        assert!(
            !bpftime_runtime::Store::dir_for(&s.store).exists(),
            "a refused load left a store behind"
        );
    }
}
