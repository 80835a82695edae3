//! Spliced PTX as golden files: each fixture module (nvcc's output and hand-written PTX,
//! tests/fixtures) with an entry, an exit and a shared-memory access probe called in every
//! kernel, compared with tests/golden/NAME.ptx. A change in what the splicer writes (where
//! calls go, what they pass, what is kept) is then a reviewed diff;
//! `BPFTIME_BLESS=1 cargo test -p bpftime-gpu-ptx --test golden` rewrites them. Where
//! NVIDIA's `ptxas` is found, each spliced module is also compiled by it.

use std::path::{Path, PathBuf};

use bpftime_gpu_ptx::fatbin::Image;
use bpftime_gpu_ptx::ptx::{ProbeCall, ProbePoint, PtxModule, Splice, Version};
use bpftime_gpu_ptx::toolchain;

const POINTS: [(ProbePoint, &str); 3] = [
    (ProbePoint::Entry, "probe_entry"),
    (ProbePoint::Exit, "probe_exit"),
    (ProbePoint::SharedAccess, "probe_access"),
];

fn dir(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(sub)
}

/// A probe function of the ABI spliced calls use that returns 0: what the splice needs
/// of one, with nothing of a compiled program's that could change the golden text.
fn probe_definition(symbol: &str, point: ProbePoint) -> String {
    let params: Vec<String> = (0..point.arg_count())
        .map(|i| format!(".param .b64 a{i}"))
        .collect();
    format!(
        ".visible .func (.param .b64 r) {symbol}({})\n{{\n\tst.param.b64 [r], 0;\n\tret;\n}}\n",
        params.join(", ")
    )
}

fn spliced(module: &PtxModule) -> String {
    let splice = Splice {
        definitions: POINTS
            .iter()
            .map(|&(point, symbol)| probe_definition(symbol, point))
            .collect(),
        needs_version: Some(Version::new(7, 8)),
        needs_sm: Some(70),
        calls: module
            .kernels
            .iter()
            .map(|k| {
                let calls = POINTS
                    .iter()
                    .map(|&(point, symbol)| ProbeCall {
                        point,
                        symbol: symbol.to_string(),
                    })
                    .collect();
                (k.name.clone(), calls)
            })
            .collect(),
        inline: false,
    };
    module
        .splice(&splice, Version::newest_for_driver(13000))
        .unwrap_or_else(|e| panic!("splicing: {e}"))
}

fn check(name: &str, text: &str) {
    let module = PtxModule::parse(text).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(
        !module.kernels.is_empty(),
        "{name} has no kernels to splice"
    );
    let out = spliced(&module);
    bpftime_golden::assert_golden(&dir("golden").join(format!("{name}.ptx")), &out);
    let Some(ptxas) = toolchain::ptxas_for_tests() else {
        return;
    };
    let sm = module.sm.unwrap_or(70).max(70);
    if let Err(e) = toolchain::ptxas_accepts(&ptxas, name, &out, sm, false) {
        panic!("ptxas refused spliced {name} for sm_{sm}: {e}");
    }
}

#[test]
fn every_fixture_module_splices_to_its_golden_text() {
    let mut names: Vec<String> = std::fs::read_dir(dir("fixtures"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".ptx"))
        .collect();
    names.sort();
    assert!(names.len() >= 8, "fixtures: {names:?}");
    for file in names {
        let text = std::fs::read_to_string(dir("fixtures").join(&file)).unwrap();
        check(file.trim_end_matches(".ptx"), &text);
    }
}

/// The fatbin path: nvcc's compressed fatbin, its PTX for sm_90 picked and decompressed,
/// then spliced as a module loaded from it would be.
#[test]
fn a_fatbins_ptx_splices_to_its_golden_text() {
    let bytes = std::fs::read(dir("fixtures").join("kernels.fatbin")).unwrap();
    let (text, _) = Image::from_bytes(&bytes)
        .unwrap()
        .ptx_for(90)
        .unwrap()
        .expect("kernels.fatbin holds PTX for sm_90");
    check("kernels.fatbin.sm_90", &text);
}
