//! The fatbin scan behind `bpftime attach PID` into a CUDA process whose modules were
//! loaded before bpftime arrived: the PTX of a kernel, found by name in the ELF objects
//! the process maps, on real nvcc output built here (pip's CUDA 13.0 nvcc, as
//! scripts/setup.sh installs it): a static-cudart program, and a shared library this test
//! process loads. Skipped, saying why, where no nvcc is found.

use std::path::{Path, PathBuf};
use std::process::Command;

use bpftime_gpu_attach::scan::{mapped_objects, FatbinIndex, MappedObject, Missing};
use bpftime_gpu_ptx::elf_fatbins::{read_container, scan_object, ObjectFatbins};

/// nvcc's name for `vectorAdd(const float *, const float *, float *, int)`.
const VECTOR_ADD: &str = "_Z9vectorAddPKfS0_Pfi";

fn nvcc() -> Option<PathBuf> {
    let found = bpftime_gpu_ptx::toolchain::find("nvcc", "NVCC");
    if found.is_none() {
        eprintln!(
            "skipped: nvcc not found (tried $NVCC, PATH, /usr/local/cuda/bin and pip's \
             nvidia-cuda-nvcc); scripts/setup.sh installs it"
        );
    }
    found
}

fn scratch(tag: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("scan-{tag}"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs nvcc with `args`, with pip's cudart beside it when that is where it is.
fn build(nvcc: &Path, args: &[&str]) {
    let mut c = Command::new(nvcc);
    c.arg("-O2").args(args);
    if let Some(lib) = nvcc.parent().and_then(Path::parent).map(|p| p.join("lib")) {
        if lib.join("libcudart_static.a").is_file() {
            c.arg(format!("-L{}", lib.display()));
        }
    }
    let o = c.output().expect("run nvcc");
    assert!(
        o.status.success(),
        "nvcc {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn attach_loop_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../bpf-examples/cuda/attach_loop.cu")
}

fn mapped(path: &Path) -> MappedObject {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).unwrap();
    MappedObject {
        path: path.to_path_buf(),
        dev: (0, 0),
        inode: m.ino(),
    }
}

fn ptx_of(found: &ObjectFatbins, kernel: &str, sm: u32) -> String {
    let c = found
        .containers
        .iter()
        .find(|c| c.has_kernel(kernel))
        .unwrap_or_else(|| panic!("no container of {} has {kernel}", found.path.display()));
    let ptx = read_container(&found.path, c).unwrap();
    let (text, arch) = ptx
        .ptx_for(sm)
        .unwrap()
        .expect("the container has PTX for the device");
    assert_eq!(arch, c.arch, "the scan and the read pick the same PTX");
    text
}

#[test]
fn a_static_cudart_program_gives_the_ptx_of_its_kernel_and_none_for_others() {
    let Some(nvcc) = nvcc() else { return };
    let dir = scratch("static");
    let exe = dir.join("attach_loop");
    let src = attach_loop_source();
    build(&nvcc, &["-o", exe.to_str().unwrap(), src.to_str().unwrap()]);

    // nvcc's default: sm_75 machine code and compute_75 PTX, beside cudart's own
    // container (machine code only).
    let found = scan_object(&exe, 90).unwrap();
    assert_eq!(found.containers.len(), 1, "{found:?}");
    assert!(found.without_ptx >= 1, "cudart's container: {found:?}");
    assert!(found.unreadable.is_empty(), "{:?}", found.unreadable);
    let c = &found.containers[0];
    assert_eq!(c.kernels, vec![VECTOR_ADD.to_string()]);
    assert_eq!(c.arch, 75);
    let text = ptx_of(&found, VECTOR_ADD, 90);
    assert!(
        text.contains(&format!(".entry {VECTOR_ADD}(")),
        "{}",
        &text[..text.len().min(600)]
    );

    let mut index = FatbinIndex::new(90);
    index.update(&[mapped(&exe)]);
    let hits = index.find(VECTOR_ADD);
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].object.path, exe);
    assert!(index.find("vectorAdd").is_empty(), "names are mangled ones");
    assert!(
        index.find("_Z9vectorAddPKfS0_Pf").is_empty(),
        "no prefix match"
    );
    assert!(index.find("noSuchKernel").is_empty());

    // A device older than the only PTX gets none.
    assert!(scan_object(&exe, 70).unwrap().containers.is_empty());
    let mut older = FatbinIndex::new(70);
    older.update(&[mapped(&exe)]);
    assert!(older.find(VECTOR_ADD).is_empty());
}

/// A kernel of a shared library: `scaleInLibrary`, with PTX for compute_75 and
/// compute_90, and the host function that launches it (cudart registers the library's
/// fatbin when it loads).
const LIBRARY: &str = r#"
extern "C" __global__ void scaleInLibrary(float *x, float by, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= by;
}
extern "C" __global__ void shiftInLibrary(float *x, float by, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += by;
}
extern "C" int launch_scale(float *x, float by, int n) {
    scaleInLibrary<<<(n + 255) / 256, 256>>>(x, by, n);
    return (int)cudaGetLastError();
}
"#;

#[test]
fn a_shared_library_this_process_loaded_is_found_through_its_mappings() {
    let Some(nvcc) = nvcc() else { return };
    let dir = scratch("shared");
    let src = dir.join("scale.cu");
    std::fs::write(&src, LIBRARY).unwrap();
    let lib = dir.join("libscale.so");
    build(
        &nvcc,
        &[
            "-shared",
            "-Xcompiler",
            "-fPIC",
            "-gencode",
            "arch=compute_75,code=[sm_75,compute_75]",
            "-gencode",
            "arch=compute_90,code=compute_90",
            "-o",
            lib.to_str().unwrap(),
            src.to_str().unwrap(),
        ],
    );
    let c_path = std::ffi::CString::new(lib.to_str().unwrap()).unwrap();
    // SAFETY: a library built above; its constructors register its fatbin with cudart,
    // which reaches for no driver until a CUDA call is made.
    let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null(), "dlopen {}", lib.display());

    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let objects = mapped_objects(&bpftime_attach::parse_proc_maps(&maps));
    assert!(objects.iter().any(|o| o.path == lib), "{objects:?}");
    let mut index = FatbinIndex::new(90);
    index.update_from_self().unwrap();
    assert!(
        index.objects_seen() >= 2,
        "the test binary and libc at least"
    );
    let hits = index.find("scaleInLibrary");
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(hits[0].object.path, lib);
    assert_eq!(
        hits[0].container.arch, 90,
        "the newest PTX the device takes"
    );
    assert_eq!(
        hits[0].container.kernels,
        vec!["scaleInLibrary".to_string(), "shiftInLibrary".to_string()]
    );
    let text = ptx_of(&hits[0].object, "scaleInLibrary", 90);
    assert!(text.contains(".entry scaleInLibrary("));
    assert!(text.contains(".target sm_90"));
    assert!(index.find(VECTOR_ADD).is_empty());
    assert!(
        index.find("launch_scale").is_empty(),
        "host code is no kernel"
    );

    // An sm_80 device gets the compute_75 PTX of the same container.
    let mut older = FatbinIndex::new(80);
    older.update_from_self().unwrap();
    let hits = older.find("shiftInLibrary");
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].container.arch, 75);
    assert!(ptx_of(&hits[0].object, "shiftInLibrary", 80).contains(".target sm_75"));
}

#[test]
fn a_container_outside_nv_fatbin_is_found_through_its_wrapper() {
    let Some(nvcc) = nvcc() else { return };
    let dir = scratch("wrapper");
    let exe = dir.join("attach_loop");
    let src = attach_loop_source();
    build(&nvcc, &["-o", exe.to_str().unwrap(), src.to_str().unwrap()]);
    // The containers under another section name: only the wrapper cudart registers
    // says where the program's own container is (cudart's has no wrapper here).
    let renamed = dir.join("attach_loop-renamed");
    let st = Command::new("objcopy")
        .arg("--rename-section")
        .arg(".nv_fatbin=.rodata.cuda")
        .arg(&exe)
        .arg(&renamed)
        .status()
        .expect("run objcopy");
    assert!(st.success());
    let found = scan_object(&renamed, 90).unwrap();
    assert_eq!(found.containers.len(), 1, "{found:?}");
    assert_eq!(found.containers[0].kernels, vec![VECTOR_ADD.to_string()]);
    assert!(ptx_of(&found, VECTOR_ADD, 90).contains(&format!(".entry {VECTOR_ADD}(")));

    // As a linker that leaves a position-independent pointer to its relocation alone
    // (lld's default) writes it: 0 in the section, the address in the addend.
    let zeroed = dir.join("attach_loop-zeroed");
    let mut bytes = std::fs::read(&renamed).unwrap();
    let elf = goblin::elf::Elf::parse(&bytes).unwrap();
    let wrapper = elf
        .section_headers
        .iter()
        .find(|s| elf.shdr_strtab.get_at(s.sh_name) == Some(".nvFatBinSegment"))
        .expect("a wrapper section")
        .sh_offset as usize;
    drop(elf);
    assert_eq!(bytes[wrapper..wrapper + 4], 0x466243b1u32.to_le_bytes());
    bytes[wrapper + 8..wrapper + 16].fill(0);
    std::fs::write(&zeroed, &bytes).unwrap();
    let again = scan_object(&zeroed, 90).unwrap();
    assert_eq!(again.containers, found.containers);
}

#[test]
fn objects_that_are_not_elf_or_hold_no_fatbin_give_nothing() {
    let dir = scratch("plain");
    let text = dir.join("notes.txt");
    std::fs::write(&text, "not an ELF file").unwrap();
    assert!(scan_object(&text, 90).is_err());
    let exe = std::env::current_exe().unwrap();
    let found = scan_object(&exe, 90).unwrap();
    assert!(found.containers.is_empty() && found.without_ptx == 0);
}

/// A library of two kernels, `same` with the given body and `other` named as given.
fn library_with(nvcc: &Path, dir: &Path, tag: &str, body: &str, other: &str) -> PathBuf {
    let src = dir.join(format!("{tag}.cu"));
    std::fs::write(
        &src,
        format!(
            "extern \"C\" __global__ void same(float *x, int n) {{\n\
             int i = blockIdx.x * blockDim.x + threadIdx.x;\n\
             if (i < n) {body};\n}}\n\
             extern \"C\" __global__ void {other}(float *x, int n) {{ x[0] = n; }}\n"
        ),
    )
    .unwrap();
    let lib = dir.join(format!("lib{tag}.so"));
    build(
        nvcc,
        &[
            "-shared",
            "-Xcompiler",
            "-fPIC",
            "-o",
            lib.to_str().unwrap(),
            src.to_str().unwrap(),
        ],
    );
    lib
}

#[test]
fn a_kernel_name_in_several_objects_is_told_apart_by_its_modules_kernels_or_refused() {
    let Some(nvcc) = nvcc() else { return };
    let dir = scratch("several");
    let doubles = library_with(&nvcc, &dir, "doubles", "x[i] *= 2", "onlyInDoubles");
    let halves = library_with(&nvcc, &dir, "halves", "x[i] /= 2", "onlyInHalves");
    let copy = dir.join("libdoubles-copy.so");
    std::fs::copy(&doubles, &copy).unwrap();
    let mut index = FatbinIndex::new(90);
    index.update(&[mapped(&doubles), mapped(&halves)]);
    assert_eq!(index.find("same").len(), 2);

    // Without the module's kernels, two different bodies: refused, both named.
    match index.ptx_of("same", None) {
        Err(Missing::Ambiguous { objects }) => {
            assert_eq!(objects, vec![doubles.clone(), halves.clone()])
        }
        other => panic!("{other:?}"),
    }
    let why = index.ptx_of("same", None).unwrap_err().to_string();
    assert!(
        why.contains("libdoubles.so") && why.contains("libhalves.so"),
        "{why}"
    );
    // The module's kernels say which.
    let kernels = |ks: &[&str]| ks.iter().map(|k| k.to_string()).collect::<Vec<_>>();
    let (ptx, object) = index
        .ptx_of("same", Some(&kernels(&["same", "onlyInHalves"])))
        .unwrap();
    assert_eq!(object, halves);
    let (text, _) = ptx.ptx_for(90).unwrap().unwrap();
    assert!(text.contains(".entry onlyInHalves("));
    let (_, object) = index
        .ptx_of("same", Some(&kernels(&["onlyInDoubles", "same"])))
        .unwrap();
    assert_eq!(object, doubles);
    // A module with kernels neither has: none of them.
    assert!(matches!(
        index.ptx_of("same", Some(&kernels(&["same", "elsewhere"]))),
        Err(Missing::OtherModule { .. })
    ));
    assert!(matches!(
        index.ptx_of("absent", None),
        Err(Missing::NoPtx { sm: 90 })
    ));

    // A file and its copy hold the same PTX: either will do.
    let mut copies = FatbinIndex::new(90);
    copies.update(&[mapped(&doubles), mapped(&copy)]);
    assert_eq!(copies.find("same").len(), 2);
    let (_, object) = copies.ptx_of("same", None).unwrap();
    assert_eq!(object, doubles);
}

#[test]
fn entry_names_are_the_kernels_the_full_parse_finds_not_declarations_or_comments() {
    use bpftime_gpu_ptx::ptx::{entry_names, PtxModule};
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../gpu-ptx/tests/fixtures");
    for f in ["kernels.ptx", "exits.ptx", "accesses.ptx"] {
        let text = std::fs::read_to_string(fixtures.join(f)).unwrap();
        let parsed: Vec<String> = PtxModule::parse(&text)
            .unwrap()
            .kernels
            .into_iter()
            .map(|k| k.name)
            .collect();
        assert!(!parsed.is_empty(), "{f}");
        assert_eq!(entry_names(&text).unwrap(), parsed, "{f}");
    }
    let text = ".version 9.0\n.target sm_90\n// .entry commented(\n/* .entry hidden( */\n\
                .extern .entry declared(.param .u64 p);\n.visible .entry defined()\n{\nret;\n}\n";
    assert_eq!(entry_names(text).unwrap(), vec!["defined"]);
}
