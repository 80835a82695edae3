//! Keeps a process's `exit()` from destroying LLVM under a compile.
//!
//! LLVM's static objects are C++ globals whose destructors `exit()` runs, on whichever
//! thread calls it, while another thread may be in the middle of a compile that uses them:
//! the agent's thread attaching a program a tool just loaded, or an application thread
//! whose CUDA module is being instrumented. The process then dies of SIGSEGV on its way
//! out, with a status it never chose. So every use of LLVM holds an [`LlvmInUse`], and an
//! exit handler waits for the uses in flight and refuses new ones before LLVM's
//! destructors run.
//!
//! Exit handlers run newest first. Ours is registered when the library that links LLVM
//! starts ([`guard_llvm_at_exit`]; else at the first use), after the destructors of
//! LLVM's globals (registered when the library was loaded): an exit that begins before
//! the first compile then refuses it rather than destroying LLVM's globals under it (seen:
//! a double free in LLVM's pass registry). LLVM registers
//! a few more when a first compile first reaches them (function-local statics of its code
//! generator); a library that links LLVM routes its `__cxa_atexit` calls through
//! [`exit_destructor_registered`] (the agent does, with the linker's `--wrap`), so that
//! ours is registered again after each and still runs first. Without that, it is
//! registered again when the first use ends, which leaves the first compile exposed.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Once;
use std::time::{Duration, Instant};

use crate::LiftError;

/// Uses of LLVM in flight, in every thread.
static IN_USE: AtomicUsize = AtomicUsize::new(0);
/// Set by the exit handler: no new use starts.
static EXITING: AtomicBool = AtomicBool::new(false);
/// Once it has run, the handler follows every registration.
static FIRST_REGISTRATION: Once = Once::new();
static REGISTERED_AFTER_FIRST_USE: Once = Once::new();
/// How long `exit()` waits for compiles in flight. Compiles take milliseconds; a longer
/// one is let go rather than hold the application's exit for ever.
const PATIENCE: Duration = Duration::from_secs(10);

thread_local! {
    /// Uses held by this thread (nested uses count once each), so that an exit from
    /// inside a use (LLVM's fatal errors call `exit`) does not wait for itself. A const
    /// initializer without a destructor: no exit-time registration of its own.
    static HELD_HERE: Cell<usize> = const { Cell::new(0) };
    /// Set while this thread registers the handler: libc's `atexit` goes through
    /// `__cxa_atexit`, which may lead back to [`exit_destructor_registered`].
    static REGISTERING: Cell<bool> = const { Cell::new(false) };
}

/// One use of LLVM in flight; the exit handler waits until it is dropped.
#[must_use = "LLVM may only be used while this is held"]
pub struct LlvmInUse {
    /// Dropped on the thread that took it (the per-thread count).
    _not_send: std::marker::PhantomData<*const ()>,
}

/// Starts a use of LLVM: every compile takes one before it creates a context. Fails
/// with [`LiftError::ProcessExiting`] once the process has begun to exit.
pub fn llvm_in_use() -> Result<LlvmInUse, LiftError> {
    guard_llvm_at_exit();
    // The handler stores EXITING then reads IN_USE; a use adds to IN_USE then reads
    // EXITING. Sequentially consistent, at least one of the two sees the other.
    IN_USE.fetch_add(1, SeqCst);
    if EXITING.load(SeqCst) {
        IN_USE.fetch_sub(1, SeqCst);
        return Err(LiftError::ProcessExiting);
    }
    HELD_HERE.with(|h| h.set(h.get() + 1));
    Ok(LlvmInUse {
        _not_send: std::marker::PhantomData,
    })
}

impl Drop for LlvmInUse {
    fn drop(&mut self) {
        let outermost = HELD_HERE.with(|h| {
            h.set(h.get() - 1);
            h.get() == 0
        });
        IN_USE.fetch_sub(1, SeqCst);
        if outermost {
            REGISTERED_AFTER_FIRST_USE.call_once(register_exit_handler);
        }
    }
}

/// Registers the gate's exit handler now, once: a library that links LLVM calls this
/// when it starts, after the loader ran LLVM's static constructors (which register their
/// destructors). Later calls, and [`llvm_in_use`], do nothing more.
pub fn guard_llvm_at_exit() {
    FIRST_REGISTRATION.call_once(|| {
        register_exit_handler();
        // SAFETY: a handler of ours that only stores an atomic, for the child side.
        unsafe { libc::pthread_atfork(None, None, Some(forget_other_threads_uses)) };
    });
}

/// Tells the gate that an exit-time destructor was just registered with `__cxa_atexit`:
/// once LLVM has been used, the gate's handler is registered again after it, so that it
/// runs first. For a library's `__cxa_atexit` wrapper; cannot panic.
pub fn exit_destructor_registered() {
    if FIRST_REGISTRATION.is_completed() && !REGISTERING.with(Cell::get) {
        register_exit_handler();
    }
}

fn register_exit_handler() {
    REGISTERING.with(|r| r.set(true));
    // SAFETY: registers a function of ours that takes no arguments, cannot unwind (only
    // atomics, a thread-local read and sleeps) and stays loaded: nothing unloads the
    // library LLVM is linked into while its destructors are registered.
    let failed = unsafe { libc::atexit(wait_for_llvm_uses) } != 0;
    REGISTERING.with(|r| r.set(false));
    if failed {
        tracing::warn!(
            "no exit handler could be registered: an exit during a compile may crash the process"
        );
    }
}

/// A forked child has only the thread that forked: the uses of the others, copied with
/// the count, will never end there, and its exit must not wait for them.
extern "C" fn forget_other_threads_uses() {
    IN_USE.store(HELD_HERE.with(Cell::get), SeqCst);
}

/// Registered several times; the first call at exit waits, the others return.
extern "C" fn wait_for_llvm_uses() {
    if EXITING.swap(true, SeqCst) {
        return;
    }
    let own = HELD_HERE.try_with(Cell::get).unwrap_or(0);
    let started = Instant::now();
    while IN_USE.load(SeqCst) > own {
        if started.elapsed() > PATIENCE {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uses_nest_and_are_counted_until_dropped() {
        let outer = llvm_in_use().unwrap();
        let inner = llvm_in_use().unwrap();
        assert_eq!(HELD_HERE.with(Cell::get), 2);
        assert!(IN_USE.load(SeqCst) >= 2);
        drop(inner);
        drop(outer);
        assert_eq!(HELD_HERE.with(Cell::get), 0);
    }

    /// A child forked while another thread compiles counts only its own uses, so that
    /// its exit does not wait for a compile that is not in it.
    #[test]
    fn a_forked_child_does_not_wait_for_its_parents_other_threads() {
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let _use = llvm_in_use().unwrap();
            held_tx.send(()).unwrap();
            done_rx.recv().unwrap();
        });
        held_rx.recv().unwrap();
        let mine = llvm_in_use().unwrap();
        // SAFETY: the child only reads atomics and its thread-local, then _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let ok = IN_USE.load(SeqCst) == 1 && HELD_HERE.with(Cell::get) == 1;
            // SAFETY: ends the child without running the parent's exit handlers.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        assert!(pid > 0, "fork failed");
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child counted its parent's other uses: {status:#x}"
        );
        assert!(IN_USE.load(SeqCst) >= 2, "the parent's count is its own");
        drop(mine);
        done_tx.send(()).unwrap();
        holder.join().unwrap();
    }
}
