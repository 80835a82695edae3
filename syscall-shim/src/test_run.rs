//! `BPF_PROG_TEST_RUN` for raw tracepoint programs: the kernel runs such a
//! program once, on the caller's thread, with the arguments the caller gives;
//! here it runs in the caller's process, on the interpreter.
//!
//! bpftrace relies on this for its `BEGIN` and `END` probes (it checks for
//! the feature at start and otherwise falls back to a uprobe on its own
//! binary, which no agent serves).

use crate::attr::{self, write_back_u32, Attr};
use crate::core::{refuse, Shim, SysResult};
use bpftime_interpreter::{execute, Environment, MemoryPolicy};
use bpftime_isa::{uapi, HelperFn, Insn};
use bpftime_prepare::MapRef;
use bpftime_runtime::{helpers, Map, ProgramRecord, Store};
use std::collections::HashMap;
use std::sync::Arc;

/// The kernel's limit on raw tracepoint arguments (`MAX_BPF_FUNC_ARGS`).
const MAX_ARGS: usize = 12;
/// `BPF_F_TEST_RUN_ON_CPU`.
const F_TEST_RUN_ON_CPU: u32 = 1;
/// The context the program runs on: the arguments, zero-filled to the size of
/// a `struct pt_regs`, the context size the verifier checked accesses against.
const CTX_LEN: usize = bpftime_verifier::PT_REGS_SIZE as usize;

/// A verified program with its map references turned into this process's
/// map handles.
pub(crate) struct Runnable {
    insns: Arc<[Insn]>,
    /// Keeps the maps the relocated instructions point at alive.
    _maps: Vec<Arc<Map>>,
}

/// Relocates map references: a map becomes the address of its handle, a map
/// value the address of the value, as the interpreter's helpers expect.
fn relocate(
    store: &Store,
    rec: &ProgramRecord,
    maps: &mut HashMap<u32, Arc<Map>>,
) -> Result<Runnable, i32> {
    let mut held = Vec::new();
    let insns = bpftime_prepare::relocate(&rec.insns, |r| {
        let id = r.map();
        let m = match maps.get(&id) {
            Some(m) => m.clone(),
            None => {
                let m = Arc::new(Map::open(store, id).map_err(|e| e.errno())?);
                maps.insert(id, m.clone());
                m
            }
        };
        let addr = match r {
            MapRef::Map(_) => Arc::as_ptr(&m) as u64,
            MapRef::Value { offset, .. } => {
                // SAFETY: a 4-byte key on the stack; global data lives at index 0.
                let base = unsafe { m.prog_lookup(0u32.to_ne_bytes().as_ptr()) };
                if base.is_null() {
                    return Err(libc::EINVAL);
                }
                base as u64 + u64::from(offset)
            }
        };
        held.push(m);
        Ok(addr)
    })?;
    Ok(Runnable {
        insns: insns.into(),
        _maps: held,
    })
}

struct Env<'a> {
    store: &'a Store,
}

// SAFETY: every helper is a runtime helper written for verified programs'
// arguments; tail calls are refused (None), which a program sees as a failed
// bpf_tail_call, as for an empty slot.
unsafe impl Environment for Env<'_> {
    fn helper(&self, id: u32) -> Option<HelperFn> {
        let _ = self.store;
        helpers::helper_by_id(id)
    }

    fn tail_call_target(&self, _map: u64, _index: u64) -> Option<Arc<[Insn]>> {
        None
    }
}

impl Shim {
    /// # Safety
    /// Pointers in `a` must be valid as `BPF_PROG_TEST_RUN` defines them.
    pub(crate) unsafe fn prog_test_run(
        &mut self,
        a: &Attr,
        attr: *mut u8,
        size: usize,
    ) -> SysResult {
        use attr::test_run as f;
        let rec = self.program(a.u32(f::PROG_FD))?;
        if rec.prog_type != uapi::prog_type::RAW_TRACEPOINT {
            return Err(refuse(
                crate::core::ENOTSUPP,
                format_args!(
                    "BPF_PROG_TEST_RUN of program `{}` (type {}): bpftime test-runs raw tracepoint programs only",
                    rec.name, rec.prog_type
                ),
            ));
        }
        let ctx_size = a.u32(f::CTX_SIZE_IN) as usize;
        let ctx_in = a.u64(f::CTX_IN) as *const u8;
        let unused_set = [
            a.u32(f::DATA_SIZE_IN) as u64,
            a.u32(f::DATA_SIZE_OUT) as u64,
            a.u64(f::DATA_IN),
            a.u64(f::DATA_OUT),
            a.u32(f::REPEAT) as u64,
            a.u32(f::DURATION) as u64,
            a.u32(f::CTX_SIZE_OUT) as u64,
            a.u64(f::CTX_OUT),
            a.u32(f::BATCH_SIZE) as u64,
        ]
        .iter()
        .any(|&v| v != 0);
        let flags = a.u32(f::FLAGS);
        if unused_set
            || (ctx_size == 0) != ctx_in.is_null()
            || ctx_size > MAX_ARGS * 8
            || !ctx_size.is_multiple_of(8)
            || flags & !F_TEST_RUN_ON_CPU != 0
            || (flags & F_TEST_RUN_ON_CPU == 0 && a.u32(f::CPU) != 0)
        {
            return Err(libc::EINVAL);
        }
        let run = self.runnable(&rec)?;
        let mut ctx = [0u8; CTX_LEN];
        if ctx_size > 0 {
            // SAFETY: caller obligation: ctx_in holds ctx_size bytes (<= 96 < CTX_LEN).
            unsafe { std::ptr::copy_nonoverlapping(ctx_in, ctx.as_mut_ptr(), ctx_size) };
        }
        helpers::set_probe_context(helpers::ProbeContext::default());
        let env = Env {
            store: self.store(),
        };
        // SAFETY: the program passed the verifier (see `runnable`), over a
        // context of CTX_LEN bytes, which `ctx` is.
        let policy = unsafe { MemoryPolicy::unchecked() };
        let r0 = execute(&run.insns, ctx.as_mut_ptr() as u64, 0, &env, &policy).map_err(|e| {
            refuse(
                libc::EFAULT,
                format_args!("test run of program `{}` failed: {e}", rec.name),
            )
        })?;
        // SAFETY: caller obligation: attr holds `size` writable bytes.
        unsafe { write_back_u32(attr, size, f::RETVAL, r0 as u32) };
        Ok(0)
    }

    /// The program ready to run here, verified once (again, if it was loaded by
    /// another process): a read-only context of at most twelve 8-byte arguments,
    /// which the zero-filled `CTX_LEN` bytes it runs on cover.
    fn runnable(&mut self, rec: &ProgramRecord) -> SysResult<Arc<Runnable>> {
        if let Some(r) = self.test_runs.get(&rec.id) {
            return Ok(r.clone());
        }
        let mut maps = HashMap::new();
        let run = relocate(self.store(), rec, &mut maps)?;
        let lookup = |id: u32| bpftime_prepare::desc_of(&maps, id);
        if let Err((errno, log)) =
            bpftime_prepare::check_program(&rec.insns, uapi::prog_type::RAW_TRACEPOINT, &lookup, 0)
        {
            return Err(refuse(
                errno,
                format_args!("program `{}` cannot be test-run:\n{log}", rec.name),
            ));
        }
        let run = Arc::new(run);
        self.test_runs.insert(rec.id, run.clone());
        Ok(run)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bpftime_isa::uapi::cmd;

    use crate::test_support::TempShim;

    fn load(shim: &mut TempShim, prog_type: u32, src: &str) -> u32 {
        let code = bpftime_isa::encode(&bpftime_isa::asm::assemble(src).unwrap());
        let mut a = [0u8; 128];
        a[0..4].copy_from_slice(&prog_type.to_ne_bytes());
        a[4..8].copy_from_slice(&((code.len() / 8) as u32).to_ne_bytes());
        a[8..16].copy_from_slice(&(code.as_ptr() as u64).to_ne_bytes());
        a[16..24].copy_from_slice(&(c"GPL".as_ptr() as u64).to_ne_bytes());
        shim.bpf(cmd::PROG_LOAD, &mut a).expect("load") as u32
    }

    fn test_run(shim: &mut TempShim, fd: u32, ctx: &[u64], repeat: u32) -> (SysResult, u32) {
        let mut a = [0u8; 128];
        a[0..4].copy_from_slice(&fd.to_ne_bytes());
        a[32..36].copy_from_slice(&repeat.to_ne_bytes());
        a[40..44].copy_from_slice(&((ctx.len() * 8) as u32).to_ne_bytes());
        if !ctx.is_empty() {
            a[48..56].copy_from_slice(&(ctx.as_ptr() as u64).to_ne_bytes());
        }
        let r = shim.bpf(cmd::PROG_TEST_RUN, &mut a);
        (r, u32::from_ne_bytes(a[4..8].try_into().unwrap()))
    }

    #[test]
    fn raw_tracepoint_programs_run_on_their_arguments_and_return_retval() {
        let mut shim = TempShim::new("shim-testrun");
        // r0 = arg0 + arg1
        let fd = load(
            &mut shim,
            uapi::prog_type::RAW_TRACEPOINT,
            "ldxdw %r0, [%r1]\nldxdw %r2, [%r1+8]\nadd %r0, %r2\nexit",
        );
        assert_eq!(test_run(&mut shim, fd, &[40, 2], 0), (Ok(0), 42));
        // No arguments: the context reads as zeros.
        assert_eq!(test_run(&mut shim, fd, &[], 0), (Ok(0), 0));
        // Fields raw tracepoints do not take are refused, as by the kernel.
        assert_eq!(test_run(&mut shim, fd, &[1, 2], 5).0, Err(libc::EINVAL));
        assert_eq!(
            test_run(&mut shim, fd, &[0; 13], 0).0,
            Err(libc::EINVAL),
            "more than 12 arguments"
        );
        // Kprobe programs have no test run in the kernel either.
        let kp = load(&mut shim, uapi::prog_type::KPROBE, "mov %r0, 0\nexit");
        assert_eq!(
            test_run(&mut shim, kp, &[], 0).0,
            Err(crate::core::ENOTSUPP)
        );
    }

    #[test]
    fn an_unsafe_raw_tracepoint_program_is_refused_before_it_runs() {
        let mut shim = TempShim::new("shim-testrun-unsafe");
        // Reads far past any context: refused at load, as by the kernel.
        let code = bpftime_isa::encode(
            &bpftime_isa::asm::assemble("ldxdw %r0, [%r1+4096]\nexit").unwrap(),
        );
        let mut a = [0u8; 128];
        a[0..4].copy_from_slice(&uapi::prog_type::RAW_TRACEPOINT.to_ne_bytes());
        a[4..8].copy_from_slice(&((code.len() / 8) as u32).to_ne_bytes());
        a[8..16].copy_from_slice(&(code.as_ptr() as u64).to_ne_bytes());
        assert_eq!(shim.bpf(cmd::PROG_LOAD, &mut a), Err(libc::EACCES));
    }
}
