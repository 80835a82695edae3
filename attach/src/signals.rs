//! Handing on signals that are not ours: to the handler ours replaced, or to the one the
//! process installed, as the kernel would have.

/// Hands a signal that is not ours to `prev`, the handler ours replaced, as the kernel
/// would have. Async-signal-safe.
///
/// # Safety
/// `info` and `ctx` as the kernel hands them to an SA_SIGINFO handler of `sig`.
pub unsafe fn chain(
    prev: &libc::sigaction,
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
) {
    match prev.sa_sigaction {
        libc::SIG_IGN => {}
        libc::SIG_DFL => {
            // SAFETY: restoring the default and re-raising is async-signal-safe; the signal is
            // delivered with the default action once this handler returns.
            unsafe {
                libc::signal(sig, libc::SIG_DFL);
                libc::raise(sig);
            }
        }
        // SAFETY: the previous owner installed `f`, with these flags; the rest is the
        // caller's obligation.
        f => unsafe {
            call_installed_handler(f, prev.sa_flags & libc::SA_SIGINFO != 0, sig, info, ctx)
        },
    }
}

/// Calls `handler` for `sig` as the kernel would: with the signal's information and
/// context when it was installed with `SA_SIGINFO` (`siginfo`), with the number alone
/// otherwise.
///
/// # Safety
/// `handler` is a function the process installed for `sig` (not `SIG_DFL` or `SIG_IGN`),
/// `siginfo` its `SA_SIGINFO` flag; `info` and `ctx` as the kernel hands them to an
/// `SA_SIGINFO` handler.
pub unsafe fn call_installed_handler(
    handler: usize,
    siginfo: bool,
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
) {
    if siginfo {
        // SAFETY: installed as an SA_SIGINFO handler.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(handler) };
        f(sig, info, ctx);
    } else {
        // SAFETY: installed as a plain handler.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        f(sig);
    }
}
