//! Compiles the device runtime (device/runtime.c) to LLVM IR for nvptx64 with clang-19,
//! which `bpftime-jit-ptx` links into every GPU probe. The IR is written without CPU or
//! feature attributes, so that it inlines into probes compiled for any `sm_XY`.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "device/runtime.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=CLANG");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("runtime.ll");
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang-19".to_string());
    let result = Command::new(&clang)
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
            "-emit-llvm",
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
        .arg(&out)
        .output();
    let output = match result {
        Ok(o) => o,
        Err(e) => panic!(
            "cannot run {clang} to build the GPU device runtime ({e}): install clang-19 \
             (scripts/setup.sh does) or set CLANG"
        ),
    };
    if !output.status.success() {
        panic!(
            "{clang} failed on {src}:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
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
