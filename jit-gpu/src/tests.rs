//! The GPU lowering's helper table and the IR folds, on hand-written IR.

use bpftime_isa::helpers::GpuImpl;
use inkwell::context::Context;
use inkwell::memory_buffer::MemoryBuffer;
use inkwell::module::Module;

use crate::lowering::*;
use crate::passes::*;

fn module<'ctx>(context: &'ctx Context, ir: &str) -> Module<'ctx> {
    let buffer = MemoryBuffer::create_from_memory_range_copy(ir.as_bytes(), "test");
    context
        .create_module_from_ir(buffer)
        .expect("test IR parses")
}

fn text(m: &Module<'_>) -> String {
    m.verify().expect("still valid IR");
    m.print_to_string().to_string()
}

const MATCH: &str = "declare i32 @llvm.nvvm.match.any.sync.i64(i32, i64)\n";

/// A match of a value made from the arguments a warp's lanes share folds to its mask;
/// one made from a lane's own argument, or through a phi (lanes may arrive by
/// different edges), stays.
/// The GPU's helpers are the registry's: each one marked for the GPU lowers, the
/// way it is marked, and no other does.
#[test]
fn the_gpu_lowers_exactly_the_registry_gpu_helpers() {
    for d in bpftime_isa::helpers::REGISTRY {
        let lowered = standard_helper(d.id);
        match d.gpu {
            GpuImpl::None => assert_eq!(lowered, None, "{}", d.name),
            GpuImpl::Builtin => assert!(
                matches!(lowered, Some(GpuHelper::Builtin(_))),
                "{} is marked builtin but has no builtin",
                d.name
            ),
            GpuImpl::Extern(n) => {
                assert_eq!(
                    lowered,
                    Some(GpuHelper::Extern(n.to_string())),
                    "{}",
                    d.name
                )
            }
        }
    }
    for id in 0..1024 {
        if bpftime_isa::helpers::lookup(id).is_none() {
            assert_eq!(
                builtin(id),
                None,
                "builtin {id} is missing from the registry"
            );
        }
    }
}

#[test]
fn matches_of_values_every_lane_shares_fold() {
    let context = Context::create();
    let m = module(
        &context,
        &format!(
            "{MATCH}define i32 @probe(i64 %site, i64 %addr, i1 %c) {{
entry:
  %k = and i64 %site, 4294967295
  %slot = shl i64 %k, 3
  %shared = add i64 %slot, 4096
  %a = call i32 @llvm.nvvm.match.any.sync.i64(i32 -1, i64 %shared)
  %own = add i64 %addr, %slot
  %b = call i32 @llvm.nvvm.match.any.sync.i64(i32 -1, i64 %own)
  br i1 %c, label %x, label %y
x:
  br label %y
y:
  %p = phi i64 [ %shared, %entry ], [ 8, %x ]
  %d = call i32 @llvm.nvvm.match.any.sync.i64(i32 -1, i64 %p)
  %s1 = add i32 %a, %b
  %s2 = add i32 %s1, %d
  ret i32 %s2
}}"
        ),
    );
    let f = m.get_function("probe").unwrap();
    let site = f.get_nth_param(0).unwrap();
    assert_eq!(fold_uniform_warp_ops(&m, &[site]).unwrap(), 1);
    let ir = text(&m);
    assert_eq!(
        ir.matches("call i32 @llvm.nvvm.match.any").count(),
        2,
        "{ir}"
    );
    assert!(!ir.contains("i64 %shared)"), "{ir}");
    // With no argument known to be shared, only constants fold (none here).
    let m = module(
        &context,
        &format!(
            "{MATCH}define i32 @probe(i64 %site) {{
  %a = call i32 @llvm.nvvm.match.any.sync.i64(i32 -1, i64 %site)
  ret i32 %a
}}"
        ),
    );
    assert_eq!(fold_uniform_warp_ops(&m, &[]).unwrap(), 0);
}

/// The runtime's question "is this address in `[LO, LO + LEN)`?" is answered yes when
/// `addr` is made from a constant inside an array's values and every array it can be
/// in lies in the range; no for an address from a constant outside every array, or
/// when an array reaches past the range. A program's own compare of the same kind is
/// left alone (it may compare a pointer it never dereferences).
#[test]
fn range_questions_about_addresses_in_arrays_are_answered() {
    let check = |base_a: u64, base_b: u64, extents: &[(u64, u64)]| {
        let context = Context::create();
        let m = module(
            &context,
            &format!(
                "declare i1 @{KNOWN_IN_RANGE}(i64, i64, i64) nounwind willreturn memory(none)
define i1 @probe(i64 %slot, i1 %c) {{
entry:
  %off = shl i64 %slot, 3
  %b = add i64 %off, {base_b}
  br i1 %c, label %x, label %y
x:
  %a = or disjoint i64 %off, {base_a}
  br label %y
y:
  %addr = phi i64 [ %a, %x ], [ %b, %entry ]
  %known = call i1 @{KNOWN_IN_RANGE}(i64 %addr, i64 4096, i64 1024)
  %rel = add i64 %addr, -4096
  %own = icmp ult i64 %rel, 1024
  %both = and i1 %known, %own
  ret i1 %both
}}"
            ),
        );
        assert_eq!(fold_known_in_range(&m, extents).unwrap(), 1);
        let ir = text(&m);
        assert!(
            !ir.contains(KNOWN_IN_RANGE),
            "every question answered: {ir}"
        );
        assert!(ir.contains("icmp ult i64 %rel, 1024"), "{ir}");
        ir.contains("and i1 true, %own")
    };
    let arrays = [(4096, 4096 + 512), (4096 + 512, 4096 + 1024)];
    assert!(check(4096, 4096 + 512, &arrays));
    // One side from a constant in no array: the verifier says nothing about it.
    assert!(!check(4096, 8192, &arrays));
    // An array that reaches past the range.
    assert!(!check(
        4096,
        4096 + 512,
        &[(4096, 4096 + 512), (4096 + 512, 4096 + 2048)]
    ));
    assert!(!check(4096, 4096 + 512, &[]));
}

/// A log2's guarded count of leading zeros (`v < 2 ? 0 : (clz(v) << 3) ^ 504`, a
/// histogram's slot offset) loses its compare: `clz(v | 1)` gives the guard's answer
/// for 0 and 1 and the same count above. A guard answering something else, or a count
/// used elsewhere too, stays.
#[test]
fn guarded_clz_becomes_the_clz_of_v_or_1() {
    let ir = |answer: u64, extra_use: bool| {
        format!(
            "declare i64 @llvm.ctlz.i64(i64, i1)
declare void @keep(i64)
define i64 @probe(i64 %v) {{
  %c = call i64 @llvm.ctlz.i64(i64 %v, i1 true)
  %s = shl i64 %c, 3
  %x = xor i64 %s, 504
  {}
  %lt = icmp ult i64 %v, 2
  %r = select i1 %lt, i64 {answer}, i64 %x
  ret i64 %r
}}",
            if extra_use {
                "call void @keep(i64 %c)"
            } else {
                ""
            }
        )
    };
    for (answer, extra_use, folds) in [(0, false, true), (8, false, false), (0, true, false)] {
        let context = Context::create();
        let m = module(&context, &ir(answer, extra_use));
        assert_eq!(fold_guarded_ctlz(&m).unwrap(), usize::from(folds));
        let text = text(&m);
        assert_eq!(!text.contains("select"), folds, "{text}");
        assert_eq!(text.contains("or i64 %v, 1"), folds, "{text}");
    }
    // The rewrite's premise, at the values where it matters.
    let slot = |lz: u32| (u64::from(lz) << 3) ^ 504;
    for v in [0u64, 1, 2, 3, 4, 7, 8, 1 << 40, u64::MAX] {
        let guarded = if v < 2 { 0 } else { slot(v.leading_zeros()) };
        assert_eq!(slot((v | 1).leading_zeros()), guarded, "{v}");
    }
}

/// clang's eBPF expansion of a count of leading zeros (smeared bits, a population
/// count of their complement) becomes `llvm.ctlz` again, at 64 and 32 bits; a chain
/// with a shift missing is some other computation and stays.
#[test]
fn smeared_population_counts_become_clz() {
    let smear = |bits: u32, shifts: &[u32]| {
        let mut body = String::new();
        let mut last = "%x".to_string();
        for (n, s) in shifts.iter().enumerate() {
            body.push_str(&format!(
                "  %s{n} = lshr i{bits} {last}, {s}\n  %o{n} = or i{bits} %s{n}, {last}\n"
            ));
            last = format!("%o{n}");
        }
        format!(
            "declare i{bits} @llvm.ctpop.i{bits}(i{bits})
define i{bits} @probe(i{bits} %x) {{
{body}  %not = xor i{bits} {last}, -1
  %n = call i{bits} @llvm.ctpop.i{bits}(i{bits} %not)
  ret i{bits} %n
}}"
        )
    };
    for (bits, shifts, folds) in [
        (64, vec![1, 2, 4, 8, 16, 32], true),
        (32, vec![1, 2, 4, 8, 16], true),
        (64, vec![1, 2, 4, 16, 32], false),
    ] {
        let context = Context::create();
        let m = module(&context, &smear(bits, &shifts));
        assert_eq!(fold_smeared_ctlz(&m).unwrap(), usize::from(folds));
        let ir = text(&m);
        assert_eq!(ir.contains("@llvm.ctlz"), folds, "{ir}");
    }
}
