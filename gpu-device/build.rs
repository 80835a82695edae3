//! Compiles the device runtime (device/runtime.c) to LLVM IR for nvptx64 with clang-19,
//! and that to bitcode with llvm-as-19, which `bpftime-jit-ptx` links into every GPU
//! probe. The IR is written without CPU or feature attributes, so that it inlines into
//! probes compiled for any `sm_XY`. Also
//! compiles device/hash_ops.c (the kernel that makes the CPU's changes to per-CPU hash
//! maps on the device) straight to PTX.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "device/runtime.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-changed=device/hash_ops.c");
    println!("cargo:rerun-if-env-changed=CLANG");
    let dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let out = dir.join("runtime.ll");
    compile(src, &["-emit-llvm"], &out);
    compile("device/hash_ops.c", &[], &dir.join("hash_ops.ptx"));
    let ir = std::fs::read_to_string(&out).expect("reading the IR clang wrote");
    let stripped: String = ir
        .lines()
        .map(|line| {
            if line.starts_with("attributes #") {
                strip_attribute(
                    &strip_attribute(line, "\"target-cpu\""),
                    "\"target-features\"",
                )
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&out, stripped).expect("writing the IR");
    // Bitcode of the same IR: a probe's compilation parses it in less time than text.
    println!("cargo:rerun-if-env-changed=LLVM_AS");
    let mut llvm_as = tool("LLVM_AS", "llvm-as-19");
    llvm_as.arg(&out).arg("-o").arg(dir.join("runtime.bc"));
    run(llvm_as, "LLVM_AS", "llvm-19", "the device runtime's IR");
}

/// Compiles the C file `src` for nvptx64 (sm_70, PTX 7.0) into `out`: PTX, or with
/// `-emit-llvm` in `extra`, LLVM IR.
fn compile(src: &str, extra: &[&str], out: &std::path::Path) {
    let mut clang = tool("CLANG", "clang-19");
    clang
        .args([
            "-target",
            "nvptx64-nvidia-cuda",
            "-march=sm_70",
            // The warp-level builtins (activemask, match, shuffles) need PTX 7.0; probes
            // are compiled for 7.8 or newer.
            "-Xclang",
            "-target-feature",
            "-Xclang",
            "+ptx70",
            "-O2",
            "-S",
        ])
        .args(extra)
        .args([
            "-x",
            "c",
            "-ffreestanding",
            "-nostdlib",
            "-fno-builtin",
            "-Wall",
            "-Werror",
            "-Wno-unused-parameter",
            src,
            "-o",
        ])
        .arg(out);
    run(clang, "CLANG", "clang-19", src);
}

/// The program `$var` names, or `default`.
fn tool(var: &str, default: &str) -> Command {
    Command::new(std::env::var(var).unwrap_or_else(|_| default.to_string()))
}

/// Runs `command` on `what`, or stops the build saying why and how to get the tool
/// (`package`, or the variable `var`).
fn run(mut command: Command, var: &str, package: &str, what: &str) {
    let name = command.get_program().to_string_lossy().into_owned();
    match command.output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "{name} failed on {what}:\n{}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => panic!(
            "cannot run {name} to build the GPU device runtime ({e}): install {package} \
             (scripts/setup.sh does) or set {var}"
        ),
    }
}

/// `line` without the string attribute `key="..."`.
fn strip_attribute(line: &str, key: &str) -> String {
    let Some(start) = line.find(&format!("{key}=\"")) else {
        return line.to_string();
    };
    let value = start + key.len() + 2;
    let end = line[value..]
        .find('"')
        .map_or(line.len(), |e| value + e + 1);
    format!("{}{}", &line[..start], line[end..].trim_start())
}
