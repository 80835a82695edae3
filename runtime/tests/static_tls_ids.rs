//! `bpf_get_current_pid_tgid` (and the map locks' owner) with the ids kept in static TLS,
//! as in the agent: each thread, and a forked child, reports its own ids. A test binary
//! of its own, since the switch is process-wide.

use bpftime_isa::uapi::helper;
use bpftime_runtime::helpers;

bpftime_attach::static_tls_flag!(fn ids_offset, "bpftime_test_ids");

fn own_ids() -> u64 {
    // SAFETY: getpid and gettid have no preconditions.
    unsafe { ((libc::getpid() as u64) << 32) | libc::gettid() as u64 }
}

fn reported_ids() -> u64 {
    let f = helpers::helper_by_id(helper::GET_CURRENT_PID_TGID).expect("the helper exists");
    // SAFETY: the helper ignores its arguments.
    unsafe { f(0, 0, 0, 0, 0) }
}

#[test]
fn threads_and_forked_children_report_their_own_ids_from_static_tls() {
    // SAFETY: this binary's own 8 bytes of static TLS, zero in every thread, used by
    // nothing else.
    unsafe { bpftime_runtime::thread::use_static_tls_ids(ids_offset()) };
    let main = reported_ids();
    assert_eq!(main, own_ids());
    // The second read is the cached one.
    assert_eq!(reported_ids(), main);
    let others: Vec<(u64, u64)> = (0..4)
        .map(|_| std::thread::spawn(|| (reported_ids(), own_ids())))
        .map(|t| t.join().unwrap())
        .collect();
    for (reported, own) in others {
        assert_eq!(reported, own);
        assert_ne!(reported, main);
    }
    // SAFETY: the child only reads its ids (a static-TLS load, or getpid/gettid and a
    // store into its own slot) and `_exit`s.
    match unsafe { libc::fork() } {
        0 => {
            let child = reported_ids();
            // SAFETY: ends the child without running the test harness's exit path.
            unsafe { libc::_exit(i32::from(child != own_ids() || child == main)) };
        }
        -1 => panic!("fork: {}", std::io::Error::last_os_error()),
        pid => {
            let mut status = 0;
            // SAFETY: waits for our own child.
            assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "the child saw its parent's ids (status {status:#x})"
            );
        }
    }
}
