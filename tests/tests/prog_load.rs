//! `BPF_PROG_LOAD` of malformed and unsafe programs: refused with the kernel's
//! errno and a log that names the instruction, and nothing is stored.

use bpftime_isa::uapi::{cmd, prog_type};
use bpftime_isa::{encode, Insn};
use bpftime_runtime::{ObjectKind, Store};
use bpftime_shim::Shim;
use bpftime_tests::kernel_object::{assert_kernel_object, BpfObject};

fn load(shim: Option<&mut Shim>, insns: &[Insn]) -> (Result<i64, i32>, String) {
    let code = encode(insns);
    let license = b"GPL\0";
    let mut log = vec![0u8; 4096];
    let mut a = [0u8; 128];
    a[0..4].copy_from_slice(&prog_type::KPROBE.to_ne_bytes());
    a[4..8].copy_from_slice(&(insns.len() as u32).to_ne_bytes());
    a[8..16].copy_from_slice(&(code.as_ptr() as u64).to_ne_bytes());
    a[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    a[24..28].copy_from_slice(&1u32.to_ne_bytes());
    a[28..32].copy_from_slice(&(log.len() as u32).to_ne_bytes());
    a[32..40].copy_from_slice(&(log.as_mut_ptr() as u64).to_ne_bytes());
    let r = match shim {
        // SAFETY: attr points at live buffers for the whole call.
        Some(s) => unsafe { s.bpf(cmd::PROG_LOAD, a.as_mut_ptr(), a.len()) },
        None => {
            // SAFETY: as above, for the kernel.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_bpf,
                    cmd::PROG_LOAD as libc::c_long,
                    a.as_mut_ptr(),
                    a.len(),
                )
            };
            if r < 0 {
                Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
            } else {
                assert_kernel_object(r as i32, BpfObject::Prog, "BPF_PROG_LOAD");
                // SAFETY: closes the program fd the kernel gave us.
                unsafe { libc::close(r as i32) };
                Ok(r)
            }
        }
    };
    let end = log.iter().position(|&b| b == 0).unwrap_or(0);
    (r, String::from_utf8_lossy(&log[..end]).into_owned())
}

const EXIT: Insn = Insn::new(0x95, 0, 0, 0, 0);
const MOV0: Insn = Insn::new(0xb7, 0, 0, 0, 0);

#[test]
fn malformed_programs_are_refused_like_the_kernel_refuses_them() {
    let cases: Vec<(&str, Vec<Insn>, &str)> = vec![
        (
            "jump out of range",
            vec![MOV0, Insn::new(0x05, 0, 0, 5, 0), EXIT],
            "jump out of range",
        ),
        (
            "no exit at the end",
            vec![MOV0, Insn::new(0x07, 0, 0, 0, 1)],
            "last insn",
        ),
        (
            "unknown helper",
            vec![Insn::new(0x85, 0, 0, 0, 99_999), EXIT],
            "unknown func",
        ),
        (
            "write to the frame pointer",
            vec![MOV0, Insn::new(0xb7, 10, 0, 0, 0), EXIT],
            "frame pointer",
        ),
        (
            "kfunc call",
            vec![Insn::new(0x85, 0, 2, 0, 1), EXIT],
            "kernel functions",
        ),
    ];
    let name = format!("test-progload-{}", std::process::id());
    let store = Store::create_or_open(&name).unwrap();
    let mut shim = Shim::new(store);
    let kernel = bpftime_tests::kernel_unavailable();
    for (what, insns, log_says) in cases {
        let (r, log) = load(Some(&mut shim), &insns);
        assert!(r.is_err(), "{what}: accepted");
        assert!(log.contains(log_says), "{what}: log {log:?}");
        match &kernel {
            None => {
                let (k, klog) = load(None, &insns);
                assert_eq!(r, k, "{what}: ours {log:?} kernel {klog:?}");
            }
            Some(why) => eprintln!("{what}: kernel comparison skipped: {why}"),
        }
    }
    let store = Store::open(&name).unwrap();
    assert!(
        store.ids(ObjectKind::Program).is_empty(),
        "a refused program is not stored"
    );
    store.destroy().unwrap();
}

#[test]
fn a_valid_program_loads_and_is_stored() {
    let name = format!("test-progok-{}", std::process::id());
    let store = Store::create_or_open(&name).unwrap();
    let mut shim = Shim::new(store);
    let (r, _) = load(Some(&mut shim), &[MOV0, EXIT]);
    assert!(r.is_ok());
    let store = Store::open(&name).unwrap();
    assert_eq!(store.ids(ObjectKind::Program).len(), 1);
    store.destroy().unwrap();
}
