//! Relocation, the one step every process that runs a stored program takes: each map
//! reference becomes the address its resolver gives, everything else stays as it was.

use bpftime_isa::{opcode as op, Insn};
use bpftime_prepare::{relocate, MapRef};

fn lddw(dst: u8, src: u8, lo: i32, hi: i32) -> [Insn; 2] {
    [
        Insn::new(op::LD_DW_IMM, dst, src, 0, lo),
        Insn::new(0, 0, 0, 0, hi),
    ]
}

fn program() -> Vec<Insn> {
    let mut p = Vec::new();
    p.extend(lddw(1, op::PSEUDO_MAP_FD, 7, 0));
    p.extend(lddw(2, op::PSEUDO_MAP_VALUE, 9, 24));
    // A plain 64-bit constant and a function address are not map references.
    p.extend(lddw(3, 0, 0x1234, 0x5678));
    p.extend(lddw(4, op::PSEUDO_FUNC, 2, 0));
    p.push(Insn::new(op::EXIT_INSN, 0, 0, 0, 0));
    p
}

#[test]
fn map_and_value_references_become_the_resolved_addresses_and_nothing_else_changes() {
    let before = program();
    let mut asked = Vec::new();
    let after = relocate(&before, |r| {
        asked.push(r);
        Ok::<u64, ()>(match r {
            MapRef::Map(id) => 0x7f00_0000_0000 + u64::from(id),
            MapRef::Value { map, offset } => {
                0x5500_0000_0000 + u64::from(map) * 0x1000 + u64::from(offset)
            }
        })
    })
    .unwrap();
    assert_eq!(
        asked,
        [MapRef::Map(7), MapRef::Value { map: 9, offset: 24 }]
    );
    let addr =
        |pc: usize| (after[pc].imm as u32 as u64) | ((after[pc + 1].imm as u32 as u64) << 32);
    assert_eq!((after[0].src, addr(0)), (0, 0x7f00_0000_0007));
    assert_eq!((after[2].src, addr(2)), (0, 0x5500_0000_9018));
    assert_eq!(after[0].dst, 1);
    assert_eq!(after[2].dst, 2);
    assert_eq!(&after[4..], &before[4..]);
}

#[test]
fn the_resolvers_first_error_is_returned() {
    let r = relocate(&program(), |r| match r {
        MapRef::Map(_) => Ok(1),
        MapRef::Value { map, .. } => Err(format!("map {map} has no values")),
    });
    assert_eq!(r.unwrap_err(), "map 9 has no values");
}

#[test]
fn a_program_ending_in_half_an_lddw_is_left_alone() {
    let cut = vec![Insn::new(op::LD_DW_IMM, 1, op::PSEUDO_MAP_FD, 0, 7)];
    let after = relocate(&cut, |_| Err::<u64, ()>(())).unwrap();
    assert_eq!(after, cut);
}
