//! Naming a captured stack: native frames by their symbols, Python frames by their code
//! objects, merged into one list, outermost first.
//!
//! Each native frame of the evaluation loop (`_PyEval_EvalFrameDefault`) is replaced by
//! the Python frames that call of it ran: one frame in 3.10, any number from 3.11 on
//! (Python-to-Python calls stay in one native call), as the thread state marks them. The
//! innermost such native frame gets the innermost run of Python frames, and so on
//! outwards; a Python run beyond the native frames found (a native stack cut short) goes
//! outermost.
//!
//! Between the outermost and the innermost Python frame, the interpreter's own native
//! frames (`_PyFunction_Vectorcall`, `slot_tp_call`, ...) are left out: they are how one
//! Python frame called the next, which the two Python frames already say, and they
//! would bury a PyTorch model's frames under ten interpreter frames per call. Native
//! frames of any other object there (an extension module calling back into Python) stay,
//! as do the interpreter's frames outside that span (its `main`, and the call out of
//! the innermost Python frame into C).

use std::sync::MutexGuard;

use crate::native::{basename, clean, Frame, Symbols};
use crate::python::{self, Codes, PyEntry};
use crate::Stack;

/// The native function that runs Python frames, in every version from 3.10 to 3.13.
const EVAL: &str = "_PyEval_EvalFrameDefault";

fn is_eval(name: &str) -> bool {
    // A compiler's split-off part keeps the name with a suffix (`.cold`).
    name.strip_prefix(EVAL)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

/// Names stacks: see [`crate::Capturer::namer`].
pub struct Namer<'a> {
    symbols: Symbols,
    codes: MutexGuard<'a, Codes>,
}

impl<'a> Namer<'a> {
    pub(crate) fn new(codes: MutexGuard<'a, Codes>) -> Namer<'a> {
        Namer {
            symbols: Symbols::default(),
            codes,
        }
    }

    /// The frames of `stack`, outermost first, without the frames on top (innermost)
    /// that lie in an object whose path contains one of `interception` (the profiler's
    /// own, a driver's).
    pub fn fold(&mut self, stack: &Stack, interception: &[String]) -> Vec<String> {
        let mut start = 0;
        while start < stack.native.len() {
            let object = &self.symbols.lookup(stack.native[start]).object;
            if !interception.iter().any(|i| object.contains(i.as_str())) {
                break;
            }
            start += 1;
        }
        let frames: Vec<Frame> = stack.native[start..]
            .iter()
            .map(|&ip| self.symbols.lookup(ip).clone())
            .collect();
        let codes = &*self.codes;
        merge(&frames, &stack.python, |code, unit| {
            clean(&python::describe(codes, code, unit))
        })
    }
}

/// `frames` (native, innermost first) with `python` (innermost first) put in, outermost
/// first.
fn merge(
    frames: &[Frame],
    python: &[PyEntry],
    describe: impl Fn(u32, i32) -> String,
) -> Vec<String> {
    // The Python frames of each native call of the evaluation loop, innermost first.
    let mut runs: Vec<Vec<(u32, i32)>> = vec![Vec::new()];
    for e in python {
        match *e {
            PyEntry::Frame { code, unit } => runs.last_mut().unwrap().push((code, unit)),
            PyEntry::CallEnd => runs.push(Vec::new()),
        }
    }
    if runs.last().is_some_and(Vec::is_empty) {
        runs.pop();
    }
    let evals: Vec<usize> = (0..frames.len())
        .filter(|&i| frames[i].names.iter().any(|n| is_eval(n)))
        .collect();
    let paired = evals.len().min(runs.len());
    let run_of = |i: usize| evals[..paired].iter().position(|&e| e == i);
    // From the innermost native call of the loop to the outermost, or to the end of the
    // native stack where Python runs beyond it go first.
    let outer_end = if runs.len() > paired {
        frames.len()
    } else {
        evals[..paired].last().copied().unwrap_or(0)
    };
    let span = (paired > 0).then(|| (evals[0], outer_end));
    let interpreter = span.map(|(inner, _)| frames[inner].object.as_str());

    let mut out: Vec<String> = Vec::new();
    let push_run = |out: &mut Vec<String>, run: &[(u32, i32)]| {
        out.extend(run.iter().rev().map(|&(code, unit)| describe(code, unit)));
    };
    for run in runs[paired..].iter().rev() {
        push_run(&mut out, run);
    }
    for i in (0..frames.len()).rev() {
        let frame = &frames[i];
        if let Some(k) = run_of(i) {
            // Names outer first: the evaluation loop, then what was inlined into it.
            let mut past_eval = false;
            for name in frame.names.iter().rev() {
                if is_eval(name) {
                    push_run(&mut out, &runs[k]);
                    past_eval = true;
                } else if !past_eval || Some(i) == span.map(|s| s.0) {
                    out.push(name.clone());
                }
            }
            continue;
        }
        if let Some((inner, outer)) = span {
            if inner < i && i < outer && Some(frame.object.as_str()) == interpreter {
                continue;
            }
        }
        if frame.names.is_empty() {
            let unknown = format!("[{}]", basename(&frame.object));
            // A run of nameless frames in one object says no more than one.
            if out.last() != Some(&unknown) {
                out.push(unknown);
            }
        } else {
            out.extend(frame.names.iter().rev().cloned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIBPYTHON: &str = "/usr/lib/libpython3.12.so.1.0";

    fn f(object: &str, names: &[&str]) -> Frame {
        Frame {
            object: object.into(),
            names: names.iter().map(|n| n.to_string()).collect(),
        }
    }

    fn py(code: u32) -> PyEntry {
        PyEntry::Frame { code, unit: 0 }
    }

    fn names(code: u32, _unit: i32) -> String {
        ["<module>", "main", "outer", "inner", "hook"][code as usize].to_string()
    }

    /// A 3.12 launch: main runs `<module>` and main in one call of the loop; main calls
    /// through a C call (`slot_tp_call`) into outer and inner, the second call; inner
    /// calls torch, which launches.
    fn launch() -> Vec<Frame> {
        [
            f("/lib/libtorch.so", &["at::launch"]),
            f(LIBPYTHON, &["PyObject_Vectorcall"]),
            // Inlined frames come innermost first.
            f(LIBPYTHON, &["_PyObject_VectorcallTstate", EVAL]),
            f(LIBPYTHON, &["_PyFunction_Vectorcall"]),
            f(LIBPYTHON, &["slot_tp_call"]),
            f(LIBPYTHON, &[&format!("{EVAL}.cold")]),
            f(LIBPYTHON, &["Py_RunMain"]),
            f("/usr/bin/python3", &[]),
            f("/usr/bin/python3", &[]),
        ]
        .into()
    }

    #[test]
    fn python_frames_take_the_place_of_the_evaluation_loop() {
        let python = [
            py(3),
            py(2),
            PyEntry::CallEnd,
            py(1),
            py(0),
            PyEntry::CallEnd,
        ];
        assert_eq!(
            merge(&launch(), &python, names),
            [
                "[python3]",
                "Py_RunMain",
                "<module>",
                "main",
                "outer",
                "inner",
                "_PyObject_VectorcallTstate",
                "PyObject_Vectorcall",
                "at::launch"
            ]
        );
    }

    #[test]
    fn extension_frames_between_python_frames_stay() {
        let mut frames = launch();
        frames[4] = f("/lib/libtorch_python.so", &["torch::call_hook"]);
        let python = [
            py(3),
            py(2),
            PyEntry::CallEnd,
            py(1),
            py(0),
            PyEntry::CallEnd,
        ];
        let folded = merge(&frames, &python, names);
        let at = |n: &str| folded.iter().position(|f| f == n).unwrap();
        assert!(at("main") < at("torch::call_hook") && at("torch::call_hook") < at("outer"));
        assert!(
            !folded.iter().any(|f| f == "_PyFunction_Vectorcall"),
            "{folded:?}"
        );
    }

    #[test]
    fn a_thread_without_python_keeps_its_native_frames() {
        let folded = merge(&launch(), &[], names);
        // A name per frame and per inlined frame, the two nameless frames as one.
        assert_eq!(folded.len(), 9, "{folded:?}");
        assert!(folded.iter().any(|f| f == "_PyFunction_Vectorcall"));
        assert!(folded.iter().any(|f| is_eval(f)));
    }

    #[test]
    fn python_runs_beyond_the_native_stack_go_outermost() {
        // The native stack was cut below the outer call of the loop; the interpreter's
        // frames between it and the Python frames put before it are left out too.
        let frames = &launch()[..4];
        let python = [
            py(3),
            py(2),
            PyEntry::CallEnd,
            py(1),
            py(0),
            PyEntry::CallEnd,
        ];
        assert_eq!(
            merge(frames, &python, names),
            [
                "<module>",
                "main",
                "outer",
                "inner",
                "_PyObject_VectorcallTstate",
                "PyObject_Vectorcall",
                "at::launch"
            ]
        );
    }

    #[test]
    fn calls_of_the_loop_beyond_the_python_frames_keep_their_native_name() {
        // Only the innermost call's frames were found (a walk cut short).
        let python = [py(3), py(2), PyEntry::CallEnd];
        let folded = merge(&launch(), &python, names);
        let cold = format!("{EVAL}.cold");
        assert_eq!(
            folded[..5],
            [
                "[python3]",
                "Py_RunMain",
                &cold,
                "slot_tp_call",
                "_PyFunction_Vectorcall"
            ]
        );
        assert_eq!(folded[5..7], ["outer", "inner"]);
    }

    #[test]
    fn a_call_of_the_loop_with_no_python_frame_of_its_own_is_left_out() {
        // The inner call ran only a frame still being set up (left out).
        let python = [PyEntry::CallEnd, py(1), py(0), PyEntry::CallEnd];
        let folded = merge(&launch(), &python, names);
        assert_eq!(folded[2..4], ["<module>", "main"]);
        assert_eq!(folded[4], "_PyObject_VectorcallTstate", "{folded:?}");
        assert!(!folded.iter().any(|f| is_eval(f)));
    }

    #[test]
    fn the_loop_is_told_by_its_name_and_its_split_off_parts() {
        assert!(is_eval(EVAL) && is_eval("_PyEval_EvalFrameDefault.cold"));
        assert!(!is_eval("_PyEval_EvalFrameDefaultX") && !is_eval("_PyEval_EvalFrame"));
    }
}
