//! The real `bpftime` against a store another user prepared: `start` and `list` refuse
//! it with one line that names the directory, its owner and the way out, and use
//! nothing in it; a store `bpftime` makes is its user's alone, whatever the umask.

use bpftime_runtime::{ObjectKind, ProgramRecord, Store};
use bpftime_tests::{run_with_timeout, Session};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const OTHER: u32 = 4242;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn listing(dir: &Path) -> Vec<(String, u64, u32, u64)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            let m = e.path().symlink_metadata().unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                m.ino(),
                m.mode(),
                m.size(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn bpftime_refuses_a_store_another_user_squatted() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: needs root to act as a second user (uid {OTHER})");
        return;
    }
    let s = Session::new("squat");
    // What the squatter copies in: a real store header and a real program.
    let stage = s.tmp.join("stage");
    std::fs::create_dir(&stage).unwrap();
    let source = Store::create_or_open(&format!("{}-source", s.store)).unwrap();
    let id = source.alloc_id();
    ProgramRecord {
        id,
        prog_type: 2,
        expected_attach_type: 0,
        name: "squatter".into(),
        insns: vec![],
        map_ids: vec![],
        gpl: true,
        owner_pid: 0,
    }
    .publish(&source)
    .unwrap();
    std::fs::copy(source.dir().join("store"), stage.join("store")).unwrap();
    std::fs::copy(source.path(ObjectKind::Program, id), stage.join("prog")).unwrap();
    source.destroy().unwrap();
    for f in ["store", "prog"] {
        std::fs::set_permissions(stage.join(f), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    // Root's own file, which links in the squatted store point at.
    let victim = s.tmp.join("victim");
    let victim_bytes = b"root's file, no store's\n".to_vec();
    std::fs::write(&victim, &victim_bytes).unwrap();

    let dir = Store::dir_for(&s.store);
    let mut squat = Command::new("sh");
    squat
        .arg("-c")
        .arg(
            r#"umask 0 && mkdir -m 777 "$1" && cp "$2/store" "$1/store" && cp "$2/prog" "$1/prog-1" &&
               chmod 666 "$1/store" "$1/prog-1" && mkdir -m 777 "$1/pins" &&
               for n in cpus trace_pipe map-2 fifo-2 link-3 perfring-4 fifo-perf-4; do ln -s "$3" "$1/$n" || exit 1; done"#,
        )
        .arg("squat")
        .arg(&dir)
        .arg(&stage)
        .arg(&victim);
    squat.uid(OTHER).gid(OTHER);
    let out = run_with_timeout(squat, Duration::from_secs(30));
    assert!(
        out.status.success(),
        "squatting failed: {}",
        text(&out.stderr)
    );
    let before = listing(&dir);

    for args in [&["start", "/bin/true"][..], &["list"][..]] {
        let mut c = s.bpftime();
        c.args(args);
        let out = run_with_timeout(c, Duration::from_secs(60));
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{args:?}: not one line: {err}"
        );
        for want in [
            &dir.display().to_string()[..],
            "owned by uid 4242",
            "rm -rf",
            "another --store",
        ] {
            assert!(err.contains(want), "{args:?}: says not `{want}`: {err}");
        }
        assert!(
            !text(&out.stdout).contains("prog"),
            "{args:?}: showed the squatter's program: {}",
            text(&out.stdout)
        );
    }
    assert_eq!(listing(&dir), before, "the squatted store was changed");
    assert_eq!(std::fs::read(&victim).unwrap(), victim_bytes);
}

#[test]
fn a_store_bpftime_makes_is_its_users_alone_whatever_the_umask() {
    let s = Session::new("umask");
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(r#"umask 0 && exec "$@""#)
        .arg("sh")
        .arg(bpftime_tests::bpftime())
        .arg("--store")
        .arg(&s.store)
        .args(["start", "/bin/true"])
        .env_remove("BPFTIME_STORE");
    let out = run_with_timeout(c, Duration::from_secs(60));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let dir = Store::dir_for(&s.store);
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    assert_eq!(
        dir.file_name().unwrap().to_str().unwrap(),
        format!("bpftime-{me}-{}", s.store)
    );
    let mode = |p: &Path| p.symlink_metadata().unwrap().mode() & 0o7777;
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join("pins")), 0o700);
    for f in ["store", "cpus"] {
        assert_eq!(mode(&dir.join(f)), 0o600, "{f}");
    }
}

/// An attach hint another user planted for a process `bpftime start` runs (the hint's
/// directory is everyone's; its name is the pid, easy to guess) is ignored with one line
/// that names it: the agent starts before `main` as without it, every call from the
/// first one is counted, and the planted file is left as it was.
#[test]
fn a_planted_attach_hint_does_not_move_the_agents_start() {
    const N: u64 = 200;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: needs root to plant a file as a second user (uid {OTHER})");
        return;
    }
    let s = Session::new("planted-hint");
    let exe = s.target_copy(bpftime_tests::examples::CALLS);
    let loader = s.load(&[
        bpftime_tests::examples::FUNCLATENCY,
        "--target",
        exe.to_str().unwrap(),
        "--func",
        "work",
    ]);
    // The shell tells its pid (the target's, after exec) and waits for the plant.
    let pid_file = s.tmp.join("pid");
    let mut c = s.bpftime();
    c.args(["start", "sh", "-c"])
        .arg(r#"echo $$ > "$1.tmp" && mv "$1.tmp" "$1" && read go && exec "$2" "$3""#)
        .arg("sh")
        .arg(&pid_file)
        .arg(&exe)
        .arg(N.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().expect("bpftime start");
    let end = std::time::Instant::now() + Duration::from_secs(30);
    let pid = loop {
        if let Ok(p) = std::fs::read_to_string(&pid_file) {
            break p.trim().parse::<u32>().expect("pid");
        }
        assert!(std::time::Instant::now() < end, "the shell never started");
        std::thread::sleep(Duration::from_millis(10));
    };
    let hint = bpftime_abi::attach_hint_path(pid);
    let planted = b"planted-store".to_vec();
    std::fs::write(&hint, &planted).unwrap();
    std::os::unix::fs::chown(&hint, Some(OTHER), Some(OTHER)).unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"go\n").unwrap();
    let out = child.wait_with_output().expect("wait");
    let kept = std::fs::read(&hint);
    let _ = std::fs::remove_file(&hint);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!("ignoring {}", hint.display())),
        "no line names the planted hint: {err}"
    );
    assert_eq!(kept.ok(), Some(planted), "the planted hint was changed");
    let (code, lines, lerr) = loader.stop();
    assert_eq!(code, 0, "loader failed: {lerr}");
    assert_eq!(
        bpftime_tests::field(&lines, "count=", "count"),
        Some(N),
        "calls were missed: {lines:?}"
    );
}
