//! The flame graph's folded stacks of launches made from Python: an interpreter embedded
//! here (a `libpython3.X.so` loaded with `RTLD_LOCAL`, as an application that embeds
//! Python loads it) runs a script whose call path is known; its innermost function calls
//! a function of ours that records a launch, as the launch program does at a kernel
//! launch. After the interpreter has finalized (as it has when the agent writes the graph
//! at exit), the folded stack must read the script's Python frames, in order and at their
//! lines, where the interpreter's native frames were, with the kernel as the leaf.
//!
//! One interpreter per process: the test runs itself once per libpython found (pyenv's
//! versions, Debian's), each run embedding one.

use std::ffi::{c_char, c_int, c_long, c_void, CString};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use bpftime_gpu_attach::launch::LAUNCH_NAME_BYTES;
use bpftime_gpu_attach::{LaunchContext, PHASE_COMPLETED, PHASE_LAUNCHED};
use bpftime_gpu_profile::LaunchStacks;

const CHILD_ENV: &str = "BPFTIME_TEST_EMBEDDED_LIBPYTHON";

/// The script, as `<string>` line by line.
const SCRIPT: &str = "\
def forward():
    launch()
def step(n):
    return forward() if n == 0 else step(n - 1)
step(2)
";
/// `function (<string>:line)` of each Python frame at the launch, outermost first.
const EXPECTED: [&str; 5] = [
    "<module> (<string>:5)",
    "step (<string>:4)",
    "step (<string>:4)",
    "step (<string>:4)",
    "forward (<string>:2)",
];

/// libpython3.10 to 3.13 shared libraries here, with their installation's prefix.
fn libpythons() -> Vec<(PathBuf, PathBuf)> {
    let mut found = Vec::new();
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let pyenv = PathBuf::from(home).join(".pyenv/versions");
    let mut versions: Vec<PathBuf> = std::fs::read_dir(&pyenv)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    versions.sort();
    for minor in 10..=13 {
        let name = format!("libpython3.{minor}.so.1.0");
        for v in &versions {
            found.push((v.join("lib").join(&name), v.clone()));
        }
        found.push((
            PathBuf::from("/usr/lib/x86_64-linux-gnu").join(&name),
            PathBuf::from("/usr"),
        ));
    }
    found.retain(|(lib, home)| {
        lib.exists() && home.join(format!("lib/{}", python_dir(lib))).is_dir()
    });
    found
}

/// `python3.X` of `libpython3.X.so.1.0`.
fn python_dir(lib: &std::path::Path) -> String {
    let name = lib.file_name().unwrap().to_string_lossy();
    name.trim_start_matches("lib")
        .split(".so")
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn launches_from_python_fold_with_their_python_frames() {
    if let Ok(lib) = std::env::var(CHILD_ENV) {
        embedded(&lib);
        return;
    }
    let libs = libpythons();
    if libs.is_empty() {
        println!("skipped: no libpython3.10 to 3.13 on this machine");
        return;
    }
    let me = std::env::current_exe().unwrap();
    let mut bad = Vec::new();
    for (lib, home) in &libs {
        let out = Command::new(&me)
            .args([
                "--exact",
                "launches_from_python_fold_with_their_python_frames",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, lib)
            .env("PYTHONHOME", home)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let folded = text
            .lines()
            .find_map(|l| l.split_once("folded: "))
            .map_or("", |(_, f)| f.trim_end_matches(" ok"));
        // From the interpreter's entry on: what the script made of the stack.
        let from = folded.find("PyRun").unwrap_or(0);
        println!("{}: ...;{}", lib.display(), &folded[from..]);
        if !out.status.success() || folded.is_empty() {
            bad.push(format!(
                "{}: {}\n{text}\n{}",
                lib.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n\n"));
}

fn stacks() -> &'static LaunchStacks {
    static S: OnceLock<LaunchStacks> = OnceLock::new();
    S.get_or_init(|| LaunchStacks::new(Vec::new()))
}

fn context(phase: u32) -> LaunchContext {
    LaunchContext {
        launch_id: 1,
        function: 0,
        stream: 0,
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_mem_bytes: 0,
        device: 0,
        cpu_ns: 1,
        gpu_start_ns: 1_000,
        gpu_end_ns: 3_000,
        clock_error_ns: 0,
        phase,
        result: 0,
        name_len: 0,
        kernel_id: 0,
        name: [0; LAUNCH_NAME_BYTES],
    }
}

/// What the script calls: a launch, recorded as the launch program records one.
extern "C" fn launch(_module: *mut c_void, _args: *mut c_void) -> *mut c_void {
    let kernel = "_Z7vec_addPKfS0_Pfi";
    stacks().record(&context(PHASE_LAUNCHED), kernel);
    stacks().record(&context(PHASE_COMPLETED), kernel);
    // SAFETY: PyLong_FromLong, found in the interpreter running this call, takes a long
    // and gives a new reference (the call's result).
    unsafe { PY_LONG.get().unwrap()(0) }
}

#[repr(C)]
struct MethodDef {
    name: *const c_char,
    meth: extern "C" fn(*mut c_void, *mut c_void) -> *mut c_void,
    flags: c_int,
    doc: *const c_char,
}

static PY_LONG: OnceLock<unsafe extern "C" fn(c_long) -> *mut c_void> = OnceLock::new();

/// Embeds the interpreter of `lib`, runs the script and checks the folded stack.
fn embedded(lib: &str) {
    let path = CString::new(lib).unwrap();
    // SAFETY: loads a shared library that stays loaded to the end of this process.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!h.is_null(), "cannot load {lib}");
    let sym = |name: &str| {
        let c = CString::new(name).unwrap();
        // SAFETY: looks a symbol up in the library loaded above.
        let p = unsafe { libc::dlsym(h, c.as_ptr()) };
        assert!(!p.is_null(), "{lib} has no {name}");
        p as usize
    };
    // SAFETY: each symbol is the CPython API function of that signature, in every version
    // from 3.10 to 3.13; they are called on this thread, as the embedding API wants.
    unsafe {
        let initialize: extern "C" fn(c_int) = std::mem::transmute(sym("Py_InitializeEx"));
        let new_function: extern "C" fn(*mut MethodDef, *mut c_void, *mut c_void) -> *mut c_void =
            std::mem::transmute(sym("PyCFunction_NewEx"));
        let add_module: extern "C" fn(*const c_char) -> *mut c_void =
            std::mem::transmute(sym("PyImport_AddModule"));
        let module_dict: extern "C" fn(*mut c_void) -> *mut c_void =
            std::mem::transmute(sym("PyModule_GetDict"));
        let set_item: extern "C" fn(*mut c_void, *const c_char, *mut c_void) -> c_int =
            std::mem::transmute(sym("PyDict_SetItemString"));
        let run: extern "C" fn(*const c_char) -> c_int =
            std::mem::transmute(sym("PyRun_SimpleString"));
        let finalize: extern "C" fn() -> c_int = std::mem::transmute(sym("Py_FinalizeEx"));
        PY_LONG.get_or_init(|| std::mem::transmute(sym("PyLong_FromLong")));

        initialize(0);
        let def = Box::leak(Box::new(MethodDef {
            name: c"launch".as_ptr(),
            meth: launch,
            flags: 0x0004, // METH_NOARGS
            doc: std::ptr::null(),
        }));
        let function = new_function(def, std::ptr::null_mut(), std::ptr::null_mut());
        assert!(!function.is_null());
        let globals = module_dict(add_module(c"__main__".as_ptr()));
        assert_eq!(set_item(globals, c"launch".as_ptr(), function), 0);
        let script = CString::new(SCRIPT).unwrap();
        assert_eq!(run(script.as_ptr()), 0, "the script failed");
        // What the agent meets at exit: the code objects are gone, their names copied.
        assert_eq!(finalize(), 0);
    }
    assert_eq!(
        bpftime_gpu_profile::python_version().map(|v| v.map(|v| v.1)),
        Ok(python_dir(std::path::Path::new(lib))[8..].parse().ok()),
    );
    let lines = stacks().folded();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    let line = &lines[0].0;
    println!("folded: {line}");
    let frames: Vec<&str> = line.split(';').collect();
    let python: Vec<usize> = (0..frames.len())
        .filter(|&i| frames[i].contains("(<string>"))
        .collect();
    let got: Vec<&str> = python.iter().map(|&i| frames[i]).collect();
    assert_eq!(got, EXPECTED, "{line}");
    assert!(
        python.windows(2).all(|w| w[1] == w[0] + 1),
        "the interpreter's frames between Python frames are left out: {line}"
    );
    let (first, last) = (python[0], python[python.len() - 1]);
    assert!(
        frames[..first]
            .iter()
            .any(|f| f.contains("PyRun_SimpleString")),
        "the interpreter's entry is outside the Python frames: {line}"
    );
    assert!(
        frames[last + 1..]
            .iter()
            .any(|f| f.contains("python_frames::launch")),
        "the function the script called is inside them: {line}"
    );
    assert!(line.ends_with(";[gpu] vec_add"), "{line}");
    assert!(!line.contains("_PyEval_EvalFrameDefault"), "{line}");
}
