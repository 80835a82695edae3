//! LLVM's destructors and the exit gate.
//!
//! C++ registers the destructor of a function-local static the first time control
//! reaches it, and LLVM has several that its code generator first reaches in a process's
//! first compile. An exit handler registered before them runs after them (newest first),
//! so an exit during that first compile would destroy them under it. The link sends
//! every `__cxa_atexit` call of this library here (build.rs); once LLVM has been used,
//! the gate's handler is registered again after each, and so runs first.

type Destructor = unsafe extern "C" fn(*mut libc::c_void);

extern "C" {
    /// libc's `__cxa_atexit`, as the linker's `--wrap` names it.
    fn __real___cxa_atexit(
        f: Destructor,
        arg: *mut libc::c_void,
        dso: *mut libc::c_void,
    ) -> libc::c_int;
}

/// # Safety
/// As `__cxa_atexit`: `f` is a function that may be called with `arg` at exit (or when
/// the object `dso` is unloaded).
#[no_mangle]
pub unsafe extern "C" fn __wrap___cxa_atexit(
    f: Destructor,
    arg: *mut libc::c_void,
    dso: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: the caller's registration, passed on unchanged.
    let registered = unsafe { __real___cxa_atexit(f, arg, dso) };
    // Atomics and a libc call only: nothing here can panic.
    bpftime_lifter::exit_destructor_registered();
    registered
}
