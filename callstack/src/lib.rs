//! A thread's call stack as a profiler inside the process sees it: the native return
//! addresses and, on a thread running CPython (3.10 to 3.13), the Python functions and
//! lines it is in, each Python frame put where the native call of the evaluation loop
//! that runs it is (as py-spy's `--native` shows them).
//!
//! [`Capturer::capture`] runs at every event (a kernel launch), so it copies only what
//! would be gone later: return addresses, and per Python frame its code object (an index
//! in the capturer's table, which copies a code object's names and line table the first
//! time it is met) and instruction. [`Namer::fold`] names all of it afterwards.

mod capture;
mod fold;
mod native;
mod python;

pub use capture::{python_version, Capturer, Stack};
pub use fold::Namer;
pub use native::{clean, containing_object};
pub use python::{line_of, PythonError};
