//! LLVM IR folds over a GPU module, run before code generation.

use bpftime_lifter::ArrayMapLayout;
use inkwell::module::Module;

use crate::ir::{call_int, intrinsic};
use crate::CompileError;

/// Where an address can come from, as the IR shows it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// An `alloca`: the eBPF stack.
    Stack,
    /// A non-null constant: a relocated map's values (eBPF cannot make up pointers).
    Map,
}

/// Whether `v` is an address inside an `alloca` (the eBPF stack): derived from one
/// through pointer casts, GEPs and integer arithmetic, or a phi/select whose every
/// input is. Loads are not looked through: a loaded value is data.
fn is_stack_address(v: inkwell::values::BasicValueEnum<'_>, depth: u32) -> bool {
    derives_from(v, Origin::Stack, depth)
}

/// Whether `v` is an address made from a constant one (a relocated map's values, or a
/// value in them picked by a computed index): a non-null constant, or derived from one
/// through pointer casts, GEPs and integer arithmetic with values that are not stack
/// addresses, or a phi/select whose every input is. Such an address is in device
/// memory, never in a thread's stack.
fn is_map_address(v: inkwell::values::BasicValueEnum<'_>, depth: u32) -> bool {
    derives_from(v, Origin::Map, depth)
}

fn derives_from(v: inkwell::values::BasicValueEnum<'_>, origin: Origin, depth: u32) -> bool {
    use inkwell::values::{BasicValue, BasicValueEnum as V, InstructionOpcode as Op};
    let constant = match v {
        V::IntValue(i) => i
            .is_const()
            .then(|| i.get_zero_extended_constant() != Some(0)),
        V::PointerValue(p) => p.is_const().then(|| !p.is_null()),
        _ => None,
    };
    if let Some(non_null) = constant {
        return origin == Origin::Map && non_null;
    }
    let Some(i) = v.as_instruction_value() else {
        return false;
    };
    if depth > 32 {
        return false;
    }
    let operands = || {
        i.get_operands().filter_map(|o| match o {
            Some(inkwell::values::Operand::Value(v)) => Some(v),
            _ => None,
        })
    };
    let from = |o| derives_from(o, origin, depth + 1);
    // What a map address is combined with must not be a stack address.
    let no_stack = |skip: usize| {
        origin == Origin::Stack
            || operands()
                .skip(skip)
                .all(|o| !is_stack_address(o, depth + 1))
    };
    match i.get_opcode() {
        Op::Alloca => origin == Origin::Stack,
        Op::GetElementPtr => operands().next().is_some_and(from) && no_stack(1),
        Op::BitCast | Op::AddrSpaceCast | Op::IntToPtr | Op::PtrToInt => {
            operands().next().is_some_and(from)
        }
        Op::Add | Op::Or => operands().any(from) && no_stack(0),
        Op::Sub if origin == Origin::Stack => operands().any(from),
        Op::Sub => operands().next().is_some_and(from) && no_stack(1),
        Op::Phi => {
            let mut incoming = operands().peekable();
            incoming.peek().is_some() && incoming.all(from)
        }
        Op::Select => {
            let mut arms = operands().skip(1).peekable();
            arms.peek().is_some() && arms.all(from)
        }
        _ => false,
    }
}

/// The bytes `[start, end)` of each array map's values that `arrays` lays out (per-CPU
/// ones left out: their copies lie elsewhere).
pub fn array_extents(arrays: &[ArrayMapLayout]) -> Vec<(u64, u64)> {
    arrays
        .iter()
        .filter(|a| a.per_cpu.is_none())
        .filter_map(|a| {
            let len = u64::from(a.key_stride).checked_mul(u64::from(a.max_entries))?;
            Some((a.values, a.values.checked_add(len)?))
        })
        .collect()
}

/// The device runtime's question "is this address, which a program's atomic add is about
/// to reach, in `[LO, LO + LEN)`?", `i1 KNOWN_IN_RANGE(i64 addr, i64 LO, i64 LEN)`, which
/// [`fold_known_in_range`] answers at compile time: 1 when it can prove so, else 0 (the
/// runtime then tests the address itself).
pub const KNOWN_IN_RANGE: &str = "bpftime_gpu_known_in_range";

/// Answers every [`KNOWN_IN_RANGE`] question: yes when every address `addr` can be is in
/// an array map's values (`extents`) and those lie within the range. `addr` is such an
/// address when it is made from a constant inside one of `extents` (an inlined lookup's
/// value, a global's) by adding offsets, through casts, phis and selects: the runtime
/// asks only of addresses a program's atomic reaches, which the verifier let it reach
/// only inside that map's values. The device runtime's test for a sharded array (is this
/// add's address in the context's shard window?) asks it, as LLVM cannot prove it when
/// the histogram is one of several picked at run time. Returns how many it answered.
pub fn fold_known_in_range(
    module: &Module<'_>,
    extents: &[(u64, u64)],
) -> Result<usize, CompileError> {
    use inkwell::values::{AnyValue, InstructionOpcode as Op};
    let mut folded = 0;
    for call in instructions_where(module, |i| i.get_opcode() == Op::Call) {
        if callee_name(call).as_deref() != Some(KNOWN_IN_RANGE) {
            continue;
        }
        let (Some((addr, lo)), Some(len)) = (first_two_operands(call), value_operand(call, 2))
        else {
            continue;
        };
        let proved = match (constant_u64(lo), constant_u64(len)) {
            (Some(lo), Some(len)) => address_extent(addr, extents, 0)
                .is_some_and(|(s, e)| s >= lo && e.checked_sub(lo).is_some_and(|n| n <= len)),
            _ => false,
        };
        let this = call.as_any_value_enum();
        if !this.is_int_value() {
            continue;
        }
        let int = this.into_int_value();
        int.replace_all_uses_with(int.get_type().const_int(u64::from(proved), false));
        call.erase_from_basic_block();
        folded += 1;
    }
    drop_unused_declaration(module, KNOWN_IN_RANGE);
    Ok(folded)
}

/// An instruction's first two operands, when both are values.
fn first_two_operands(
    i: inkwell::values::InstructionValue<'_>,
) -> Option<(
    inkwell::values::BasicValueEnum<'_>,
    inkwell::values::BasicValueEnum<'_>,
)> {
    Some((value_operand(i, 0)?, value_operand(i, 1)?))
}

/// Operand `n` of `i`, when it is a value (not a block).
fn value_operand(
    i: inkwell::values::InstructionValue<'_>,
    n: u32,
) -> Option<inkwell::values::BasicValueEnum<'_>> {
    match i.get_operand(n) {
        Some(inkwell::values::Operand::Value(v)) => Some(v),
        _ => None,
    }
}

/// The name of the function `call` calls (its last operand).
fn callee_name(call: inkwell::values::InstructionValue<'_>) -> Option<String> {
    let callee = value_operand(call, call.get_num_operands().checked_sub(1)?)?;
    Some(callee.get_name().to_string_lossy().into_owned())
}

/// Deletes the declaration of `name` once nothing calls it: a question of the device
/// runtime's that a fold has answered everywhere, which would otherwise read as a helper
/// the runtime lacks.
fn drop_unused_declaration(module: &Module<'_>, name: &str) {
    use inkwell::values::BasicValue;
    if let Some(f) = module.get_function(name) {
        if f.as_global_value()
            .as_pointer_value()
            .get_first_use()
            .is_none()
        {
            // SAFETY: a declaration nothing refers to any more.
            unsafe { f.delete() };
        }
    }
}

fn constant_u64(v: inkwell::values::BasicValueEnum<'_>) -> Option<u64> {
    v.is_int_value()
        .then(|| v.into_int_value())
        .filter(|i| i.is_const())
        .and_then(|i| i.get_zero_extended_constant())
}

/// The hull of the extents `v` can point into, made as [`fold_known_in_range`] says;
/// `None` when it is not made so.
fn address_extent(
    v: inkwell::values::BasicValueEnum<'_>,
    extents: &[(u64, u64)],
    depth: u32,
) -> Option<(u64, u64)> {
    use inkwell::values::{BasicValue, InstructionOpcode as Op, Operand};
    if let Some(c) = constant_u64(v) {
        return extents.iter().copied().find(|&(s, e)| s <= c && c < e);
    }
    let i = v.as_instruction_value()?;
    if depth > 32 {
        return None;
    }
    let operands: Vec<_> = i
        .get_operands()
        .map(|o| match o {
            Some(Operand::Value(v)) => Some(v),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let hull = |a: (u64, u64), b: (u64, u64)| (a.0.min(b.0), a.1.max(b.1));
    match i.get_opcode() {
        Op::BitCast | Op::AddrSpaceCast | Op::IntToPtr | Op::PtrToInt => {
            address_extent(*operands.first()?, extents, depth + 1)
        }
        // An offset added to a map address: exactly one side is the address (LLVM writes
        // a disjoint add as `or`).
        Op::Add | Op::Or => {
            let mut sides = operands
                .iter()
                .map(|&o| address_extent(o, extents, depth + 1));
            match (sides.next()?, sides.next()?) {
                (Some(e), None) | (None, Some(e)) => Some(e),
                _ => None,
            }
        }
        Op::GetElementPtr => {
            let e = address_extent(*operands.first()?, extents, depth + 1)?;
            operands[1..]
                .iter()
                .all(|&o| address_extent(o, extents, depth + 1).is_none())
                .then_some(e)
        }
        Op::Sub => {
            let e = address_extent(*operands.first()?, extents, depth + 1)?;
            (address_extent(*operands.get(1)?, extents, depth + 1).is_none()).then_some(e)
        }
        Op::Phi => operands
            .iter()
            .map(|&o| address_extent(o, extents, depth + 1))
            .reduce(|a, b| Some(hull(a?, b?)))?,
        Op::Select => operands[1..]
            .iter()
            .map(|&o| address_extent(o, extents, depth + 1))
            .reduce(|a, b| Some(hull(a?, b?)))?,
        _ => None,
    }
}

/// Turns clang's BPF expansion of a count of leading zeros back into one: eBPF has no
/// such instruction, so `__builtin_clz` (and the loop LLVM recognizes as one, such as a
/// log2's `while (v >>= 1) r++`) reaches us as the bits below the highest set one smeared
/// down (`x |= x >> 1`, `>> 2`, .. `>> N/2`) and a population count of the complement,
/// about 15 GPU instructions where `clz` is one. Returns how many it turned back.
pub fn fold_smeared_ctlz(module: &Module<'_>) -> Result<usize, CompileError> {
    use inkwell::values::{AnyValue, InstructionOpcode as Op, Operand};
    let builder = module.get_context().create_builder();
    let mut folded = 0;
    for call in instructions_where(module, |i| i.get_opcode() == Op::Call) {
        if !callee_name(call).is_some_and(|n| n.starts_with("llvm.ctpop.i")) {
            continue;
        }
        let Some(Operand::Value(arg)) = call.get_operand(0) else {
            continue;
        };
        let Some(x) = unsmeared_complement(arg) else {
            continue;
        };
        let int = x.into_int_value();
        let ctlz = intrinsic(module, "llvm.ctlz", &[int.get_type().into()])?;
        builder.position_before(&call);
        let zeros = call_int(
            &builder,
            ctlz,
            &[
                int.into(),
                module.get_context().bool_type().const_zero().into(),
            ],
            "clz",
        )?;
        call.as_any_value_enum()
            .into_int_value()
            .replace_all_uses_with(zeros);
        call.erase_from_basic_block();
        folded += 1;
    }
    Ok(folded)
}

/// Rewrites `select (v <u 2), C, g(ctlz(v))` as `g(ctlz(v | 1))` where `g(ctlz(1))` is
/// `C`, and returns how many it rewrote. A log2 written as `while (v >>= 1) r++` (which
/// LLVM turns into a count of leading zeros) is 0 for 0 and 1, so its count comes guarded
/// by a compare; but `v | 1` has the same leading zeros as `v` for every `v` above 1, and
/// those of 1 for 0 and 1, so the guard's answer is the count's own where `g` maps
/// `ctlz(1)` to it. On a GPU the compare and the select of a 64-bit value are four
/// instructions, the `or` one. `g` is a chain of single-use integer operations with a
/// constant operand each (memtrace's slot address: `(clz << 3) ^ 504`), evaluated at
/// `ctlz(1)` by constant folding.
pub fn fold_guarded_ctlz(module: &Module<'_>) -> Result<usize, CompileError> {
    use inkwell::values::{AnyValue, AsValueRef, BasicValue, InstructionOpcode as Op};
    use inkwell::IntPredicate;
    let builder = module.get_context().create_builder();
    let mut folded = 0;
    for select in instructions_where(module, |i| i.get_opcode() == Op::Select) {
        let (Some(cond), Some(yes), Some(no)) = (
            value_operand(select, 0),
            value_operand(select, 1),
            value_operand(select, 2),
        ) else {
            continue;
        };
        let Some(icmp) = cond
            .as_instruction_value()
            .filter(|i| i.get_opcode() == Op::ICmp)
        else {
            continue;
        };
        let (Some(v), Some(bound)) = (
            value_operand(icmp, 0),
            value_operand(icmp, 1).and_then(constant_u64),
        ) else {
            continue;
        };
        // (the guard's answer, the guarded count's chain)
        let (guarded, chain) = match (icmp.get_icmp_predicate(), bound) {
            (Some(IntPredicate::ULT), 2) | (Some(IntPredicate::ULE), 1) => (yes, no),
            (Some(IntPredicate::UGT), 1) | (Some(IntPredicate::UGE), 2) => (no, yes),
            _ => continue,
        };
        let Some(answer) = constant_u64(guarded) else {
            continue;
        };
        // Down the chain to the count, each link used once (by the next).
        let mut links = Vec::new();
        let mut at = chain;
        let ctlz = loop {
            let Some(i) = at.as_instruction_value() else {
                break None;
            };
            if i.get_first_use().is_none_or(|u| u.get_next_use().is_some()) {
                break None;
            }
            if i.get_opcode() == Op::Call {
                let is_ctlz = callee_name(i).is_some_and(|n| n.starts_with("llvm.ctlz.i"));
                let of_v =
                    value_operand(i, 0).is_some_and(|x| x.as_value_ref() == v.as_value_ref());
                break (is_ctlz && of_v).then_some(i);
            }
            let next = match i.get_opcode() {
                Op::ZExt | Op::Trunc => value_operand(i, 0),
                Op::Shl | Op::LShr | Op::Xor | Op::Or | Op::And | Op::Add | Op::Sub => {
                    match (value_operand(i, 0), value_operand(i, 1)) {
                        (Some(a), Some(b)) if constant_u64(b).is_some() => Some(a),
                        (Some(a), Some(b)) if constant_u64(a).is_some() => Some(b),
                        _ => None,
                    }
                }
                _ => None,
            };
            let Some(next) = next else { break None };
            links.push(i);
            at = next;
        };
        let Some(ctlz) = ctlz else { continue };
        // g(ctlz(1)): the chain again, on the constant.
        let ty = ctlz.get_type().into_int_type();
        let mut value = ty.const_int(u64::from(ty.get_bit_width()) - 1, false);
        builder.position_before(&select);
        let mut evaluated = true;
        for link in links.iter().rev() {
            let other = |n| value_operand(*link, n).map(|o| o.into_int_value());
            let on_left = value_operand(*link, 0).and_then(constant_u64).is_none();
            let (lhs, rhs) = match (on_left, other(0), other(1)) {
                (true, _, Some(k)) => (value, k),
                (false, Some(k), _) => (k, value),
                _ => (value, value),
            };
            let result = match link.get_opcode() {
                Op::ZExt => builder.build_int_z_extend(value, link.get_type().into_int_type(), ""),
                Op::Trunc => builder.build_int_truncate(value, link.get_type().into_int_type(), ""),
                Op::Shl => builder.build_left_shift(lhs, rhs, ""),
                Op::LShr => builder.build_right_shift(lhs, rhs, false, ""),
                Op::Xor => builder.build_xor(lhs, rhs, ""),
                Op::Or => builder.build_or(lhs, rhs, ""),
                Op::And => builder.build_and(lhs, rhs, ""),
                Op::Add => builder.build_int_add(lhs, rhs, ""),
                Op::Sub => builder.build_int_sub(lhs, rhs, ""),
                _ => unreachable!("only these links are followed"),
            }?;
            if !result.is_const() {
                evaluated = false;
                break;
            }
            value = result;
        }
        if !evaluated || value.get_zero_extended_constant() != Some(answer) {
            continue;
        }
        builder.position_before(&ctlz);
        let v = v.into_int_value();
        let or = builder.build_or(v, v.get_type().const_int(1, false), "nonzero")?;
        if !ctlz.set_operand(0, or) {
            continue;
        }
        select
            .as_any_value_enum()
            .into_int_value()
            .replace_all_uses_with(chain.into_int_value());
        select.erase_from_basic_block();
        folded += 1;
    }
    Ok(folded)
}

/// `x` when `v` is `~smear(x)`: `smear` the ors of shifts right by N/2, .., 2, 1 (outermost
/// first) of an N-bit integer (32 or 64).
fn unsmeared_complement<'ctx>(
    v: inkwell::values::BasicValueEnum<'ctx>,
) -> Option<inkwell::values::BasicValueEnum<'ctx>> {
    use inkwell::values::{AsValueRef, BasicValue, BasicValueEnum, InstructionOpcode as Op};
    let value = value_operand;
    let same =
        |a: BasicValueEnum<'ctx>, b: BasicValueEnum<'ctx>| a.as_value_ref() == b.as_value_ref();
    let not = v.as_instruction_value()?;
    if not.get_opcode() != Op::Xor {
        return None;
    }
    let (a, b) = (value(not, 0)?, value(not, 1)?);
    let mut smeared = match (constant_u64(b), constant_u64(a)) {
        (Some(_), _) if b.into_int_value().get_sign_extended_constant() == Some(-1) => a,
        (_, Some(_)) if a.into_int_value().get_sign_extended_constant() == Some(-1) => b,
        _ => return None,
    };
    let bits = smeared.into_int_value().get_type().get_bit_width();
    if bits != 32 && bits != 64 {
        return None;
    }
    let mut shift = bits / 2;
    while shift >= 1 {
        let or = smeared.as_instruction_value()?;
        if or.get_opcode() != Op::Or {
            return None;
        }
        let (p, q) = (value(or, 0)?, value(or, 1)?);
        // One side is `inner >> shift`, the other `inner`.
        let shifted_of = |s: BasicValueEnum<'ctx>| {
            let i = s.as_instruction_value()?;
            (i.get_opcode() == Op::LShr && constant_u64(value(i, 1)?) == Some(u64::from(shift)))
                .then(|| value(i, 0))?
        };
        smeared = match (shifted_of(p), shifted_of(q)) {
            (Some(inner), _) if same(inner, q) => q,
            (_, Some(inner)) if same(inner, p) => p,
            _ => return None,
        };
        shift /= 2;
    }
    Some(smeared)
}

/// Whether every lane of a warp holds `v` alike: a constant, one of `uniform` (values by
/// their LLVM references), or pure arithmetic, casts, compares and selects of such
/// values. A phi is not: lanes that reach it by different edges hold different inputs.
/// Nor is a load, or a call's result.
fn is_warp_uniform(v: inkwell::values::BasicValueEnum<'_>, uniform: &[usize], depth: u32) -> bool {
    use inkwell::values::{AsValueRef, BasicValue, BasicValueEnum as V, InstructionOpcode as Op};
    let constant = match v {
        V::IntValue(i) => i.is_const(),
        V::PointerValue(p) => p.is_const(),
        _ => false,
    };
    if constant || uniform.contains(&(v.as_value_ref() as usize)) {
        return true;
    }
    let Some(i) = v.as_instruction_value() else {
        return false;
    };
    if depth > 32 {
        return false;
    }
    let pure = matches!(
        i.get_opcode(),
        Op::Add
            | Op::Sub
            | Op::Mul
            | Op::UDiv
            | Op::SDiv
            | Op::URem
            | Op::SRem
            | Op::Shl
            | Op::LShr
            | Op::AShr
            | Op::And
            | Op::Or
            | Op::Xor
            | Op::Trunc
            | Op::ZExt
            | Op::SExt
            | Op::PtrToInt
            | Op::IntToPtr
            | Op::BitCast
            | Op::AddrSpaceCast
            | Op::GetElementPtr
            | Op::ICmp
            | Op::Select
            | Op::Freeze
    );
    pure && i.get_operands().all(|o| match o {
        Some(inkwell::values::Operand::Value(o)) => is_warp_uniform(o, uniform, depth + 1),
        Some(inkwell::values::Operand::Block(_)) => false,
        None => true,
    })
}

/// Every instruction of `module` that `keep` picks, in order; collected before a pass
/// rewrites or erases any of them.
fn instructions_where<'ctx>(
    module: &Module<'ctx>,
    keep: impl Fn(inkwell::values::InstructionValue<'ctx>) -> bool,
) -> Vec<inkwell::values::InstructionValue<'ctx>> {
    module
        .get_functions()
        .flat_map(|f| f.get_basic_block_iter())
        .flat_map(|bb| bb.get_instructions())
        .filter(|&i| keep(i))
        .collect()
}

/// Rewrites atomic operations on the eBPF stack as plain loads and stores.
///
/// The stack is private to its thread, so nothing can observe the difference, and
/// GPUs have no atomics on private memory: LLVM 19's NVPTX backend aborts the whole
/// process ("Cannot select AtomicCmpSwap ... addrspace 5") once it proves an atomic's
/// address is local, and a generic atomic that lands in local memory is undefined in
/// PTX. Run it on the optimized module, just before code generation, when the
/// optimizer has exposed every stack address it will see. Returns how many it rewrote.
pub fn demote_stack_atomics(module: &Module<'_>) -> Result<usize, CompileError> {
    use inkwell::values::{InstructionOpcode as Op, Operand};
    use inkwell::AtomicRMWBinOp as Rmw;
    let context = module.get_context();
    let builder = context.create_builder();
    let mut rewritten = 0;
    fn operand(
        i: inkwell::values::InstructionValue<'_>,
        n: u32,
    ) -> Result<inkwell::values::BasicValueEnum<'_>, CompileError> {
        match i.get_operand(n) {
            Some(Operand::Value(v)) => Ok(v),
            _ => Err(CompileError::InvalidIr {
                message: format!("atomic operation without operand {n}"),
            }),
        }
    }
    let on_stack = |i: inkwell::values::InstructionValue<'_>| {
        matches!(i.get_opcode(), Op::AtomicRMW | Op::AtomicCmpXchg)
            && matches!(i.get_operand(0), Some(Operand::Value(p)) if is_stack_address(p, 0))
    };
    for atomic in instructions_where(module, on_stack) {
        builder.position_before(&atomic);
        let ptr = operand(atomic, 0)?.into_pointer_value();
        let replacement = if atomic.get_opcode() == Op::AtomicRMW {
            let value = operand(atomic, 1)?.into_int_value();
            let old = builder
                .build_load(value.get_type(), ptr, "old")?
                .into_int_value();
            let new = match atomic.get_atomic_rmw_bin_op() {
                Some(Rmw::Add) => builder.build_int_add(old, value, "new")?,
                Some(Rmw::Sub) => builder.build_int_sub(old, value, "new")?,
                Some(Rmw::And) => builder.build_and(old, value, "new")?,
                Some(Rmw::Or) => builder.build_or(old, value, "new")?,
                Some(Rmw::Xor) => builder.build_xor(old, value, "new")?,
                Some(Rmw::Xchg) => value,
                other => {
                    return Err(CompileError::InvalidIr {
                        message: format!("unexpected atomic operation {other:?}"),
                    })
                }
            };
            builder.build_store(ptr, new)?;
            old.as_instruction()
        } else {
            let expected = operand(atomic, 1)?.into_int_value();
            let new = operand(atomic, 2)?.into_int_value();
            let ty = expected.get_type();
            let old = builder.build_load(ty, ptr, "old")?.into_int_value();
            let equal =
                builder.build_int_compare(inkwell::IntPredicate::EQ, old, expected, "equal")?;
            let stored = builder.build_select(equal, new, old, "stored")?;
            builder.build_store(ptr, stored)?;
            // cmpxchg yields { old, success }.
            let pair = context.struct_type(&[ty.into(), context.bool_type().into()], false);
            let with_old = builder.build_insert_value(pair.get_poison(), old, 0, "with_old")?;
            let result = builder.build_insert_value(with_old, equal, 1, "result")?;
            result.into_struct_value().as_instruction()
        };
        let replacement = replacement.ok_or_else(|| CompileError::InvalidIr {
            message: "stack atomic replacement folded to a constant".into(),
        })?;
        atomic.replace_all_uses_with(&replacement);
        atomic.erase_from_basic_block();
        rewritten += 1;
    }
    Ok(rewritten)
}

/// The library functions non-fetching atomic adds go through when the library defines
/// them (GPU attach's device runtime does): `u64 f(u64 addr, u64 value, u64, u64, u64)`,
/// for 64-bit and 32-bit adds. A counter that every thread of a kernel bumps is one
/// address for a whole warp; such a function sums the warp's values and makes one
/// atomic where the hardware would serialize 32.
pub const WARP_ADD_U64: &str = "bpftime_gpu_warp_add_u64";
pub const WARP_ADD_U32: &str = "bpftime_gpu_warp_add_u32";

/// Sends each `atomicrmw add` whose result is unused (eBPF's `lock add`, not `lock fetch
/// add`) through [`WARP_ADD_U64`] or [`WARP_ADD_U32`], where the module defines them.
/// Adds on the stack become plain again later (`demote_stack_atomics`, after inlining).
pub(crate) fn route_atomic_adds(module: &Module<'_>) -> Result<usize, CompileError> {
    use inkwell::values::{AnyValue, InstructionOpcode as Op, Operand};
    use inkwell::AtomicRMWBinOp as Rmw;
    let defined = |name| {
        module
            .get_function(name)
            .filter(|f| f.count_basic_blocks() > 0)
    };
    let (Some(add64), Some(add32)) = (defined(WARP_ADD_U64), defined(WARP_ADD_U32)) else {
        return Ok(0);
    };
    let context = module.get_context();
    let builder = context.create_builder();
    let i64t = context.i64_type();
    let mut routed = 0;
    // The warp adds themselves make plain atomics.
    let routable = |i: inkwell::values::InstructionValue<'_>| {
        i.get_opcode() == Op::AtomicRMW
            && i.get_atomic_rmw_bin_op() == Some(Rmw::Add)
            && i.get_first_use().is_none()
            && i.get_parent()
                .and_then(|bb| bb.get_parent())
                .is_some_and(|f| f != add64 && f != add32)
    };
    for add in instructions_where(module, routable) {
        let (Some(Operand::Value(ptr)), Some(Operand::Value(value))) =
            (add.get_operand(0), add.get_operand(1))
        else {
            continue;
        };
        let value = value.into_int_value();
        let target = match value.get_type().get_bit_width() {
            64 => add64,
            32 => add32,
            _ => continue,
        };
        builder.position_before(&add);
        let addr = builder.build_ptr_to_int(ptr.into_pointer_value(), i64t, "addr")?;
        let wide = builder.build_int_z_extend_or_bit_cast(value, i64t, "value")?;
        let zero = i64t.const_zero();
        builder.build_call(
            target,
            &[
                addr.into(),
                wide.into(),
                zero.into(),
                zero.into(),
                zero.into(),
            ],
            "",
        )?;
        let _ = add.as_any_value_enum();
        add.erase_from_basic_block();
        routed += 1;
    }
    Ok(routed)
}

/// The device runtime's question "is this value the same in every lane of the warp?",
/// which [`fold_uniform_warp_ops`] answers at compile time: 1 when it can prove so, else 0.
pub const KNOWN_UNIFORM: &str = "bpftime_gpu_known_uniform";

/// Folds warp-wide operations on values every lane holds alike: a `match.any.sync` of
/// one value is its member mask, and a `shfl.sync` of one value is that value; and
/// `isspacep.local` is true of the eBPF stack and false of an address made from a
/// constant one (an inlined array lookup's). A value every lane holds alike is a
/// constant, one of `uniform` (the probe's arguments that are the same across a warp's
/// call), or arithmetic on such values alone ([`is_warp_uniform`]). A counter's add then
/// needs no match and no shuffles: the device runtime's warp-aggregated add of a
/// constant to a constant address, or to an address made from the call site's
/// constants (memtrace's count per kernel and kind), reduces to one atomic of 32 times
/// the constant by the first lane. It also answers every [`KNOWN_UNIFORM`] question the
/// device runtime asks. Returns how many it folded.
pub fn fold_uniform_warp_ops<'ctx>(
    module: &Module<'ctx>,
    uniform: &[inkwell::values::BasicValueEnum<'ctx>],
) -> Result<usize, CompileError> {
    use inkwell::values::{AnyValue, AsValueRef, InstructionOpcode as Op, Operand};
    let uniform: Vec<usize> = uniform.iter().map(|v| v.as_value_ref() as usize).collect();
    let mut folded = 0;
    for call in instructions_where(module, |i| i.get_opcode() == Op::Call) {
        let Some(name) = callee_name(call) else {
            continue;
        };
        if name == "llvm.nvvm.isspacep.local" {
            // An address made from a constant one is a relocated map's: device
            // memory, never a thread's stack. The stack is seen through the casts
            // from its slot.
            let Some(Operand::Value(ptr)) = call.get_operand(0) else {
                continue;
            };
            let this = call.as_any_value_enum();
            if !ptr.is_pointer_value() || !this.is_int_value() {
                continue;
            }
            let answer = if is_stack_address(ptr, 0) {
                1
            } else if is_map_address(ptr, 0) {
                0
            } else {
                continue;
            };
            let int = this.into_int_value();
            int.replace_all_uses_with(int.get_type().const_int(answer, false));
            call.erase_from_basic_block();
            folded += 1;
            continue;
        }
        if name == KNOWN_UNIFORM {
            // Answered now, whatever it is: the device runtime has no definition of it.
            let (Some(Operand::Value(value)), this) =
                (call.get_operand(0), call.as_any_value_enum())
            else {
                continue;
            };
            if !this.is_int_value() {
                continue;
            }
            let answer = u64::from(is_warp_uniform(value, &uniform, 0));
            let int = this.into_int_value();
            int.replace_all_uses_with(int.get_type().const_int(answer, false));
            call.erase_from_basic_block();
            folded += 1;
            continue;
        }
        // (intrinsic, operand that becomes the result)
        let keep = if name.starts_with("llvm.nvvm.match.any.sync.") {
            0
        } else if name.starts_with("llvm.nvvm.shfl.sync.") && !name.ends_with(".p") {
            1
        } else {
            continue;
        };
        let (Some(Operand::Value(value)), Some(Operand::Value(result))) =
            (call.get_operand(1), call.get_operand(keep))
        else {
            continue;
        };
        if !(value.is_int_value() && is_warp_uniform(value, &uniform, 0)) {
            continue;
        }
        let this = call.as_any_value_enum();
        if !this.is_int_value() || !result.is_int_value() {
            continue;
        }
        if this.into_int_value().get_type() != result.into_int_value().get_type() {
            continue;
        }
        this.into_int_value()
            .replace_all_uses_with(result.into_int_value());
        call.erase_from_basic_block();
        folded += 1;
    }
    drop_unused_declaration(module, KNOWN_UNIFORM);
    Ok(folded)
}

/// Turns the probe context back into pointer arithmetic: eBPF registers are integers,
/// so after inlining, the program's context reads are `inttoptr (ptrtoint %ctx + C)`,
/// which hides the context's stack slot from SROA. Each becomes a GEP from the slot,
/// after which SROA turns the reads at constant offsets into the values stored there
/// (the probe's arguments). Returns how many it rewrote.
pub fn fold_stack_pointer_casts<'ctx>(module: &Module<'ctx>) -> Result<usize, CompileError> {
    use inkwell::values::{AnyValue, BasicValue, BasicValueEnum, InstructionOpcode as Op};
    let context = module.get_context();
    let builder = context.create_builder();
    let i8t = context.i8_type();
    let mut rewritten = 0;
    let value_of = value_operand;
    // The alloca behind `v` when `v` is `ptrtoint %alloca`.
    let cast_alloca = |v: BasicValueEnum<'ctx>| {
        let i = v.as_instruction_value()?;
        if i.get_opcode() != Op::PtrToInt {
            return None;
        }
        let p = value_of(i, 0)?;
        let a = p.as_instruction_value()?;
        (a.get_opcode() == Op::Alloca).then(|| p.into_pointer_value())
    };
    for cast in instructions_where(module, |i| i.get_opcode() == Op::IntToPtr) {
        let Some(int) = value_of(cast, 0) else {
            continue;
        };
        let (base, offset) = if let Some(base) = cast_alloca(int) {
            (base, 0i64)
        } else {
            let Some(add) = int.as_instruction_value() else {
                continue;
            };
            if add.get_opcode() != Op::Add {
                continue;
            }
            let (Some(a), Some(b)) = (value_of(add, 0), value_of(add, 1)) else {
                continue;
            };
            let constant = |v: BasicValueEnum<'ctx>| {
                v.is_int_value()
                    .then(|| v.into_int_value())
                    .filter(|c| c.is_const())
                    .and_then(|c| c.get_sign_extended_constant())
            };
            match (cast_alloca(a), constant(b), cast_alloca(b), constant(a)) {
                (Some(base), Some(c), _, _) | (_, _, Some(base), Some(c)) => (base, c),
                _ => continue,
            }
        };
        builder.position_before(&cast);
        // SAFETY: (for LLVM) a byte offset from the slot; an out-of-bounds one is
        // as undefined as the integer arithmetic it replaces, and the verifier
        // keeps context reads inside the context.
        let gep = unsafe {
            builder.build_gep(
                i8t,
                base,
                &[context.i64_type().const_int(offset as u64, true)],
                "ctx_field",
            )?
        };
        let old = cast.as_any_value_enum().into_pointer_value();
        old.replace_all_uses_with(gep);
        cast.erase_from_basic_block();
        rewritten += 1;
    }
    Ok(rewritten)
}
