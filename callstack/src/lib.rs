//! A thread's call stack as a profiler inside the process sees it: the native return
//! addresses and, on a thread running CPython (3.10 to 3.13), the Python functions and
//! lines it is in, each Python frame put where the native call of the evaluation loop
//! that runs it is (as py-spy's `--native` shows them).
//!
//! [`Capturer::capture`] runs at every event (a kernel launch), so it copies only what
//! would be gone later: return addresses, and per Python frame its code object (an index
//! in the capturer's table, which copies a code object's names and line table the first
//! time it is met) and instruction. [`Namer::fold`] names all of it afterwards.

mod fold;
mod native;
mod python;

use std::sync::Mutex;

pub use fold::Namer;
pub use native::{clean, containing_object};
pub use python::PythonError;

use python::{Codes, PyEntry};

/// One captured stack: hashable, so that equal stacks are counted once.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Stack {
    /// Return addresses, innermost first.
    native: Box<[usize]>,
    /// The Python part, innermost first; empty on a thread without Python.
    python: Box<[PyEntry]>,
}

impl Stack {
    /// The return addresses, innermost first.
    pub fn native(&self) -> &[usize] {
        &self.native
    }

    /// The Python frames in it.
    pub fn python_frames(&self) -> usize {
        self.python
            .iter()
            .filter(|e| matches!(e, PyEntry::Frame { .. }))
            .count()
    }
}

/// Captures stacks, and keeps what names their Python frames.
pub struct Capturer {
    python: bool,
    codes: Mutex<Codes>,
}

impl Default for Capturer {
    fn default() -> Self {
        Capturer::new()
    }
}

impl Capturer {
    /// Captures with the Python frames of threads that run Python.
    pub fn new() -> Capturer {
        Capturer {
            python: true,
            codes: Mutex::new(Codes::default()),
        }
    }

    /// Captures native frames only.
    pub fn native_only() -> Capturer {
        Capturer {
            python: false,
            ..Capturer::new()
        }
    }

    /// The calling thread's stack.
    #[inline(never)]
    pub fn capture(&self) -> Stack {
        let native = native::capture();
        let mut py = Vec::new();
        if self.python {
            if let Ok(Some(interp)) = python::interpreter() {
                interp.capture(&self.codes, &mut py);
            }
        }
        Stack {
            native,
            python: py.into_boxed_slice(),
        }
    }

    /// The calling thread's Python frames alone (how many), for timing them apart from
    /// the native walk.
    #[doc(hidden)]
    pub fn capture_python_only(&self) -> usize {
        let mut py = Vec::new();
        if let Ok(Some(interp)) = python::interpreter() {
            interp.capture(&self.codes, &mut py);
        }
        py.len()
    }

    /// A stack of the calling thread's native frames and the Python frames found from the
    /// thread state at `thread_state`, which may be anything: for tests that hand the
    /// walk garbage. Without an interpreter in the process, native frames only.
    #[doc(hidden)]
    pub fn capture_from_thread_state(&self, thread_state: usize) -> Stack {
        let native = native::capture();
        let mut py = Vec::new();
        if let Ok(Some(interp)) = python::interpreter() {
            interp.capture_from(thread_state, &self.codes, &mut py);
        }
        Stack {
            native,
            python: py.into_boxed_slice(),
        }
    }

    /// Names stacks this capturer took. It holds the capturer's table of code objects
    /// while it lives, so captures on other threads wait for it: keep it for one write.
    pub fn namer(&self) -> Namer<'_> {
        Namer::new(self.codes.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The CPython version whose frames stacks get (`(3, 12)`), none in a process without
/// Python, or why a Python in it gets none.
pub fn python_version() -> Result<Option<(u8, u8)>, PythonError> {
    match python::interpreter() {
        Ok(Some(i)) => Ok(Some((3, i.minor))),
        Ok(None) => Ok(None),
        Err(e) => Err(e.clone()),
    }
}
