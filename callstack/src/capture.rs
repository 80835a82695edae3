//! Capturing a stack: the native return addresses, and the Python frames of a thread
//! running CPython.

use std::sync::Mutex;

use crate::fold::Namer;
use crate::native;
use crate::python::{self, Codes, PyEntry, PythonError};

/// One captured stack: hashable, so that equal stacks are counted once.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Stack {
    /// Return addresses, innermost first.
    pub(crate) native: Box<[usize]>,
    /// The Python part, innermost first; empty on a thread without Python.
    pub(crate) python: Box<[PyEntry]>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_without_python_captures_native_frames_only() {
        // This test binary links no Python.
        let c = Capturer::new();
        let stack = c.capture();
        assert_eq!(python_version(), Ok(None));
        assert_eq!(stack.python_frames(), 0);
        assert_eq!(
            stack,
            Stack {
                python: Box::default(),
                ..stack.clone()
            }
        );
        let folded = c.namer().fold(&stack, &[]);
        assert!(
            folded
                .iter()
                .any(|f| f.contains("a_process_without_python")),
            "{folded:?}"
        );
        assert_eq!(c.capture_from_thread_state(0xdead_0000).python_frames(), 0);
    }
}
