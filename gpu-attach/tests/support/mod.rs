//! What the splice tests share: the fixtures (nvcc's output, tests/fixtures/make.sh), the
//! nvcc module's kernels, and NVIDIA's `ptxas` as the judge of spliced PTX. Each test
//! crate uses part of it.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use bpftime_gpu_attach::fatbin::Image;
use bpftime_gpu_attach::ptx::{Kernel, PtxModule};
use bpftime_gpu_attach::toolchain;

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

pub fn read(name: &str) -> Vec<u8> {
    std::fs::read(fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

pub fn ptxas() -> Option<PathBuf> {
    toolchain::ptxas_for_tests()
}

pub fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("bpftime-splice-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

pub fn assert_ptxas_accepts(tag: &str, ptx: &str) {
    assert_ptxas_accepts_for(tag, ptx, 90);
}

pub fn assert_ptxas_accepts_for(tag: &str, ptx: &str, sm: u32) {
    let Some(ptxas) = ptxas() else { return };
    let dir = scratch(tag);
    let file = dir.join(format!("{tag}.ptx"));
    std::fs::write(&file, ptx).expect("writing PTX");
    if let Err(e) = toolchain::run_ptxas(&ptxas, &file, sm, false) {
        panic!("ptxas refused the spliced module {tag} for sm_{sm}: {e}\n{ptx}");
    }
}

/// kernels.fatbin's PTX for sm_90 (nvcc's), parsed.
pub fn nvcc_module() -> PtxModule {
    let bytes = read("kernels.fatbin");
    let (text, _) = Image::from_bytes(&bytes)
        .unwrap()
        .ptx_for(90)
        .unwrap()
        .expect("PTX");
    PtxModule::parse(&text).unwrap()
}

/// The kernel of `module` whose (mangled) name contains `name`.
pub fn kernel_named<'m>(module: &'m PtxModule, name: &str) -> &'m Kernel {
    module
        .kernels
        .iter()
        .find(|k| k.name.contains(name))
        .unwrap_or_else(|| panic!("no {name}"))
}
