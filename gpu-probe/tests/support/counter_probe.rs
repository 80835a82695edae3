//! The probe the cache tests and the compile bench both build: a counter in an inlined
//! array map (map 2) that also reads the clock into the stack, and that map's layout.

use std::collections::HashMap;

use bpftime_gpu_probe::DeviceMapRef;
use bpftime_isa::asm::assemble;
use bpftime_isa::Insn;
use bpftime_jit_ptx::ArrayMapLayout;

/// The map's number in the program.
pub const MAP: u32 = 2;

/// A counter in array map [`MAP`], and the clock read into the stack.
pub fn counter() -> Vec<Insn> {
    let mut insns = assemble(
        "stw [%r10-4], 0\nlddw %r1, 2\nmov %r2, %r10\nadd %r2, -4\ncall 1\njeq %r0, 0, +4\n\
         mov %r1, 1\nlock add [%r0+0], %r1\ncall 5\nstxdw [%r10-16], %r0\nmov %r0, 0\nexit",
    )
    .expect("assembles");
    for insn in insns.iter_mut() {
        if insn.is_lddw() && insn.imm == MAP as i32 {
            insn.src = bpftime_isa::opcode::PSEUDO_MAP_FD;
        }
    }
    insns
}

/// [`MAP`] as a 4-entry array of 8-byte values whose descriptor is at `desc`.
pub fn maps(desc: u64) -> HashMap<u32, DeviceMapRef> {
    let array = ArrayMapLayout {
        values: desc + 0x100,
        key_stride: 8,
        max_entries: 4,
        update_size: 8,
        per_cpu: None,
    };
    let map = DeviceMapRef {
        desc,
        values: Some(array.values),
        array: Some(array),
    };
    [(MAP, map)].into_iter().collect()
}
