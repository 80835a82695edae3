fn main() {
    // Every call the agent's code makes to `__cxa_atexit` (LLVM's C++ static objects
    // register their destructors with it) goes to `__wrap___cxa_atexit` in src/exit.rs,
    // which keeps the LLVM exit gate's handler ahead of them (bpftime_lifter::exit_gate).
    println!("cargo:rustc-cdylib-link-arg=-Wl,--wrap=__cxa_atexit");
    println!("cargo:rerun-if-changed=build.rs");
}
