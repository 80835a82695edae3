//! One safe and one unsafe program per rule; each rejection pins its kind and index.

mod common;

use bpftime_isa::uapi::prog_type;
use bpftime_isa::Insn;
use bpftime_verifier::{
    verify, Options, ProgramInfo, RejectKind, SourceLine, PROG_TYPE_CONFORMANCE,
};
use common::*;

macro_rules! accept {
    ($name:ident, $src:expr) => {
        #[test]
        fn $name() {
            ok($src);
        }
    };
}

macro_rules! reject {
    ($name:ident, $src:expr, $insn:expr, $pat:pat) => {
        #[test]
        fn $name() {
            let e = bad($src);
            assert!(matches!(e.kind, $pat), "wrong kind:\n{}", e.log());
            assert_eq!(e.insn, $insn, "wrong insn:\n{}", e.log());
        }
    };
}

// ---- registers and exit ------------------------------------------------------

accept!(exit_with_scalar, "mov %r0, 0\nexit");
reject!(
    exit_with_uninit_r0,
    "exit",
    0,
    RejectKind::UninitRegister { reg: 0 }
);
// Privileged programs may leak addresses; a probe's return value is ignored.
accept!(exit_with_pointer_r0, "mov %r0, %r10\nexit");
reject!(
    read_uninit_register,
    "mov %r0, %r3\nexit",
    0,
    RejectKind::UninitRegister { reg: 3 }
);
reject!(
    write_frame_pointer,
    "mov %r10, 0\nmov %r0, 0\nexit",
    0,
    RejectKind::FramePointerWrite
);
reject!(
    load_into_frame_pointer,
    "ldxdw %r10, [%r1]\nmov %r0, 0\nexit",
    0,
    RejectKind::FramePointerWrite
);
accept!(
    division_by_zero_is_defined,
    "mov %r0, 7\nmov %r2, 0\ndiv %r0, %r2\nmod %r0, %r2\nexit"
);
accept!(
    signed_ops,
    "mov %r0, -7\nsdiv %r0, 2\nsmod %r0, 3\narsh %r0, 1\nexit"
);
#[test]
fn unknown_opcode() {
    let e = run_with(
        &[Insn::new(0xff, 0, 0, 0, 0), Insn::new(0x95, 0, 0, 0, 0)],
        prog_type::KPROBE,
        false,
    )
    .unwrap_err();
    assert!(matches!(e.kind, RejectKind::UnknownOpcode { code: 0xff }));
    assert_eq!(e.insn, 0);
}

// ---- context -----------------------------------------------------------------

accept!(ctx_aligned_loads, "ldxdw %r2, [%r1+160]\nldxw %r3, [%r1+4]\nldxh %r4, [%r1+2]\nldxb %r5, [%r1+167]\nmov %r0, 0\nexit");

// The words of the context a program reads, which a uprobe hook then need only fill in:
// none, the ones loaded (also on a path a branch leaves, and in a subprogram given the
// context), and all of them once the context reaches a helper.
#[test]
fn ctx_words_read_are_the_words_loaded() {
    assert_eq!(ok("mov %r0, 0\nexit").ctx_words_read, 0);
    // rdi (112), rsi (104) and ss (160, a 4-byte load at 164).
    let v = ok("ldxdw %r2, [%r1+112]\njeq %r2, 0, +2\nldxdw %r3, [%r1+104]\nldxw %r4, [%r1+164]\nmov %r0, 0\nexit");
    assert_eq!(v.ctx_words_read, 1 << 14 | 1 << 13 | 1 << 20);
    // A subprogram reading rax (80) through the context it is given.
    let v = ok("call local f\nexit\nf:\nldxdw %r0, [%r1+80]\nexit");
    assert_eq!(v.ctx_words_read, 1 << 10);
}

#[test]
fn ctx_words_read_are_all_once_a_helper_gets_the_context() {
    let v = ok("stdw [%r10-8], 0\nmov %r4, %r10\nadd %r4, -8\nmov %r5, 8\nmov %r3, 0\nldmap %r2, 4\ncall 25\nexit");
    assert_eq!(v.ctx_words_read, u64::MAX);
}
reject!(
    ctx_out_of_bounds,
    "ldxw %r2, [%r1+200]\nmov %r0, 0\nexit",
    0,
    RejectKind::CtxAccess { off: 200, size: 4 }
);
reject!(
    ctx_last_qword_overrun,
    "ldxdw %r2, [%r1+164]\nmov %r0, 0\nexit",
    0,
    RejectKind::CtxAccess { off: 164, size: 8 }
);
reject!(
    ctx_misaligned,
    "ldxdw %r2, [%r1+4]\nmov %r0, 0\nexit",
    0,
    RejectKind::MisalignedCtxAccess { off: 4, size: 8 }
);
reject!(
    ctx_write,
    "stxdw [%r1+8], %r1\nmov %r0, 0\nexit",
    0,
    RejectKind::CtxAccess { .. }
);
reject!(
    ctx_store_imm,
    "stw [%r1], 0\nmov %r0, 0\nexit",
    0,
    RejectKind::CtxAccess { .. }
);
reject!(
    ctx_moved_pointer_deref,
    "add %r1, 8\nldxdw %r2, [%r1]\nmov %r0, 0\nexit",
    1,
    RejectKind::ModifiedCtxDeref { reg: 1, off: 8 }
);
accept!(
    ctx_moved_and_back,
    "add %r1, 8\nadd %r1, -8\nldxdw %r2, [%r1]\nmov %r0, 0\nexit"
);
reject!(
    ctx_var_arith,
    "ldxdw %r2, [%r1]\nand %r2, 8\nadd %r1, %r2\nldxdw %r0, [%r1]\nexit",
    3,
    RejectKind::VariableCtxAccess { .. }
);
reject!(
    ctx_negative_offset,
    "ldxdw %r2, [%r1-8]\nmov %r0, 0\nexit",
    0,
    RejectKind::CtxAccess { off: -8, .. }
);

// ---- stack -------------------------------------------------------------------

accept!(
    stack_spill_fill_keeps_pointer,
    "stxdw [%r10-8], %r1\nldxdw %r2, [%r10-8]\nldxdw %r0, [%r2]\nexit"
);
// Privileged programs may read stack never written (the kernel lets root):
// the bytes are some number, never a pointer.
accept!(stack_uninit_read, "ldxdw %r0, [%r10-8]\nexit");
accept!(
    stack_partial_init_read,
    "stw [%r10-8], 1\nldxdw %r0, [%r10-8]\nexit"
);
reject!(
    stack_uninit_read_is_not_a_pointer,
    "ldxdw %r1, [%r10-8]\nldxdw %r0, [%r1]\nexit",
    1,
    RejectKind::InvalidMemAccess { reg: 1, .. }
);
reject!(
    stack_uninit_next_to_spill_is_not_a_pointer,
    "stxdw [%r10-16], %r1\nldxdw %r1, [%r10-8]\nldxdw %r0, [%r1]\nexit",
    2,
    RejectKind::InvalidMemAccess { reg: 1, .. }
);
accept!(
    stack_bytes_then_read,
    "stw [%r10-8], 1\nstw [%r10-4], 2\nldxdw %r0, [%r10-8]\nexit"
);
reject!(
    stack_below_frame,
    "stdw [%r10-520], 1\nmov %r0, 0\nexit",
    0,
    RejectKind::StackOutOfBounds { .. }
);
reject!(
    stack_above_frame,
    "stdw [%r10], 1\nmov %r0, 0\nexit",
    0,
    RejectKind::StackOutOfBounds { .. }
);
accept!(
    stack_bottom,
    "stdw [%r10-512], 1\nldxdw %r0, [%r10-512]\nexit"
);
reject!(
    stack_partial_overwrite_turns_pointer_to_data,
    "stxdw [%r10-8], %r1\nstb [%r10-8], 0\nldxdw %r2, [%r10-8]\nldxdw %r0, [%r2]\nexit",
    3,
    RejectKind::InvalidMemAccess { reg: 2, .. }
);
reject!(
    stack_partial_fill_of_pointer,
    "stxdw [%r10-8], %r1\nldxw %r0, [%r10-8]\nexit",
    1,
    RejectKind::PartialSpillRead { .. }
);
accept!(
    stack_spilled_scalar_keeps_bounds,
    "ldxdw %r2, [%r1]\nand %r2, 7\nstxdw [%r10-8], %r2\nldxdw %r3, [%r10-8]\nmov %r4, %r10\nadd %r4, -8\nadd %r4, %r3\nldxb %r0, [%r4]\nexit"
);
accept!(
    stack_variable_offset_read_of_initialized,
    "stdw [%r10-16], 0\nstdw [%r10-8], 0\nldxdw %r2, [%r1]\nand %r2, 7\nmov %r3, %r10\nadd %r3, -16\nadd %r3, %r2\nldxb %r0, [%r3]\nexit"
);
accept!(
    stack_variable_offset_read_of_uninit,
    "stdw [%r10-8], 0\nldxdw %r2, [%r1]\nand %r2, 7\nmov %r3, %r10\nadd %r3, -16\nadd %r3, %r2\nldxb %r0, [%r3]\nexit"
);
reject!(
    stack_variable_offset_read_past_frame,
    "stdw [%r10-8], 0\nldxdw %r2, [%r1]\nand %r2, 15\nmov %r3, %r10\nadd %r3, -8\nadd %r3, %r2\nldxb %r0, [%r3]\nexit",
    6,
    RejectKind::StackOutOfBounds { .. }
);

// ---- pointer arithmetic --------------------------------------------------------

reject!(
    pointer_multiply,
    "mov %r2, %r10\nmul %r2, 2\nmov %r0, 0\nexit",
    1,
    RejectKind::PtrOpProhibited { .. }
);
reject!(
    pointer_alu32,
    "mov %r2, %r10\nadd32 %r2, 2\nmov %r0, 0\nexit",
    1,
    RejectKind::PtrOpProhibited { .. }
);
reject!(
    pointer_and,
    "mov %r2, %r10\nand %r2, -8\nmov %r0, 0\nexit",
    1,
    RejectKind::PtrOpProhibited { .. }
);
reject!(
    pointer_plus_unbounded,
    "ldxdw %r2, [%r1]\nmov %r3, %r10\nadd %r3, %r2\nmov %r0, 0\nexit",
    2,
    RejectKind::UnboundedOffset { reg: 3 }
);
accept!(
    pointer_minus_pointer,
    "mov %r2, %r10\nadd %r2, -8\nmov %r0, %r10\nsub %r0, %r2\nexit"
);
reject!(
    map_ptr_arith,
    "ldmap %r1, 1\nadd %r1, 8\nmov %r0, 0\nexit",
    2,
    RejectKind::PtrArithProhibited { reg: 1, .. }
);
reject!(
    scalar_deref,
    "mov %r2, 4096\nldxdw %r0, [%r2]\nexit",
    1,
    RejectKind::InvalidMemAccess { reg: 2, .. }
);
reject!(
    map_ptr_deref,
    "ldmap %r2, 1\nldxdw %r0, [%r2]\nexit",
    2,
    RejectKind::InvalidMemAccess { reg: 2, .. }
);

// ---- maps --------------------------------------------------------------------

const LOOKUP: &str = "stw [%r10-4], 0\nmov %r2, %r10\nadd %r2, -4\nldmap %r1, 1\ncall 1\n";

accept!(
    map_lookup_checked,
    &format!("{LOOKUP}jeq %r0, 0, +1\nldxdw %r0, [%r0]\nexit")
);
accept!(
    map_lookup_checked_ne,
    &format!("{LOOKUP}jne %r0, 0, +2\nmov %r0, 0\nexit\nldxdw %r0, [%r0]\nexit")
);
reject!(
    map_lookup_unchecked,
    &format!("{LOOKUP}ldxdw %r0, [%r0]\nexit"),
    6,
    RejectKind::InvalidMemAccess { reg: 0, .. }
);
reject!(
    map_lookup_null_branch_deref,
    &format!("{LOOKUP}jne %r0, 0, +1\nldxdw %r0, [%r0]\nexit"),
    7,
    RejectKind::InvalidMemAccess { reg: 0, .. }
);
accept!(
    map_lookup_copy_is_checked_too,
    &format!("{LOOKUP}mov %r6, %r0\njeq %r0, 0, +1\nldxdw %r0, [%r6]\nmov %r0, 0\nexit")
);
reject!(
    map_value_out_of_bounds,
    &format!("{LOOKUP}jeq %r0, 0, +1\nldxdw %r0, [%r0+4]\nexit"),
    7,
    RejectKind::RegionOutOfBounds { .. }
);
accept!(
    map_key_uninit,
    "mov %r2, %r10\nadd %r2, -4\nldmap %r1, 1\ncall 1\nmov %r0, 0\nexit"
);
reject!(
    map_key_past_frame,
    "mov %r2, %r10\nadd %r2, -2\nldmap %r1, 1\ncall 1\nmov %r0, 0\nexit",
    4,
    RejectKind::StackOutOfBounds { .. }
);
reject!(
    map_key_not_a_pointer,
    "mov %r2, 0\nldmap %r1, 1\ncall 1\nmov %r0, 0\nexit",
    3,
    RejectKind::HelperArgType { reg: 2, .. }
);
reject!(
    map_arg_not_a_map,
    "stw [%r10-4], 0\nmov %r2, %r10\nadd %r2, -4\nmov %r1, 0\ncall 1\nmov %r0, 0\nexit",
    4,
    RejectKind::HelperArgType { reg: 1, .. }
);
accept!(
    map_value_variable_offset_bounded,
    "stw [%r10-4], 0\nmov %r2, %r10\nadd %r2, -4\nldmap %r1, 2\ncall 1\njeq %r0, 0, +5\nldxdw %r1, [%r0]\nand %r1, 15\nadd %r0, %r1\nldxb %r0, [%r0]\nexit\nmov %r0, 0\nexit"
);
reject!(
    map_value_variable_offset_too_far,
    "stw [%r10-4], 0\nmov %r2, %r10\nadd %r2, -4\nldmap %r1, 2\ncall 1\njeq %r0, 0, +5\nldxdw %r1, [%r0]\nand %r1, 31\nadd %r0, %r1\nldxb %r0, [%r0]\nexit\nmov %r0, 0\nexit",
    10,
    RejectKind::RegionOutOfBounds { .. }
);
accept!(
    map_value_bounded_by_compare,
    "stw [%r10-4], 0\nmov %r2, %r10\nadd %r2, -4\nldmap %r1, 2\ncall 1\njeq %r0, 0, +6\nldxdw %r1, [%r0]\njgt %r1, 15, +3\nadd %r0, %r1\nldxb %r0, [%r0]\nexit\nmov %r0, 0\nexit"
);
accept!(
    map_update_with_stack_value,
    "stw [%r10-4], 0\nstdw [%r10-16], 0\nmov %r2, %r10\nadd %r2, -4\nmov %r3, %r10\nadd %r3, -16\nmov %r4, 0\nldmap %r1, 1\ncall 2\nexit"
);
accept!(
    map_update_value_uninit,
    "stw [%r10-4], 0\nstw [%r10-16], 0\nmov %r2, %r10\nadd %r2, -4\nmov %r3, %r10\nadd %r3, -16\nmov %r4, 0\nldmap %r1, 1\ncall 2\nexit"
);
accept!(
    map_value_stores_pointer_as_root,
    &format!("{LOOKUP}jeq %r0, 0, +1\nstxdw [%r0], %r10\nmov %r0, 0\nexit")
);
reject!(
    unknown_map_fd,
    "ldmap %r1, 99\nmov %r0, 0\nexit",
    0,
    RejectKind::UnknownMap { fd: 99 }
);
// A map of maps: a lookup gives an inner map (or NULL), which the null check turns
// into a map pointer that map helpers take, with the template's key and value sizes.
const INNER_LOOKUP: &str = "stw [%r10-4], 0\nmov %r2, %r10\nadd %r2, -4\nldmap %r1, 9\ncall 1\n";
accept!(
    map_in_map_lookup_gives_the_inner_map,
    &format!("{INNER_LOOKUP}jeq %r0, 0, +6\nmov %r1, %r0\nmov %r2, %r10\nadd %r2, -4\ncall 1\nmov %r0, 0\nexit\nmov %r0, 0\nexit")
);
reject!(
    map_in_map_inner_needs_a_null_check,
    &format!("{INNER_LOOKUP}mov %r1, %r0\nmov %r2, %r10\nadd %r2, -4\ncall 1\nmov %r0, 0\nexit"),
    9,
    RejectKind::HelperArgType {
        reg: 1,
        expected: "map_ptr",
        ..
    }
);
reject!(
    map_in_map_inner_is_not_memory,
    &format!("{INNER_LOOKUP}jeq %r0, 0, +2\nldxdw %r1, [%r0]\nmov %r0, 0\nexit"),
    7,
    RejectKind::InvalidMemAccess { reg: 0, .. }
);
reject!(
    map_in_map_inner_key_is_the_templates,
    &format!("{INNER_LOOKUP}jeq %r0, 0, +6\nmov %r1, %r0\nmov %r2, %r10\nadd %r2, -2\ncall 1\nmov %r0, 0\nexit\nmov %r0, 0\nexit"),
    10,
    RejectKind::StackOutOfBounds { .. }
);
reject!(
    map_in_map_outer_takes_lookups_only,
    "stw [%r10-4], 0\nmov %r2, %r10\nadd %r2, -4\nmov %r3, %r2\nldmap %r1, 9\nmov %r4, 0\ncall 2\nmov %r0, 0\nexit",
    7,
    RejectKind::MapHelperMismatch { .. }
);
accept!(
    map_value_direct,
    "ldmapval %r1, 11, 8\nldxdw %r0, [%r1]\nexit"
);
reject!(
    map_value_direct_needs_single_element_array,
    "ldmapval %r1, 2, 8\nldxdw %r0, [%r1]\nexit",
    0,
    RejectKind::MapValueOffset { .. }
);
reject!(
    map_value_direct_too_far,
    "ldmapval %r1, 11, 12\nldxdw %r0, [%r1]\nexit",
    2,
    RejectKind::RegionOutOfBounds { .. }
);

// ---- helper / map compatibility ------------------------------------------------

reject!(
    unknown_helper,
    "call 9999\nmov %r0, 0\nexit",
    0,
    RejectKind::UnknownHelper { id: 9999 }
);
accept!(
    helper_clobbers_but_r6_survives,
    "mov %r6, 1\ncall 5\nmov %r0, %r6\nexit"
);
reject!(
    helper_clobbers_r1,
    "mov %r1, 1\ncall 5\nmov %r0, %r1\nexit",
    2,
    RejectKind::UninitRegister { reg: 1 }
);
reject!(
    ringbuf_output_needs_ringbuf,
    "stdw [%r10-8], 0\nmov %r2, %r10\nadd %r2, -8\nmov %r3, 8\nmov %r4, 0\nldmap %r1, 4\ncall 130\nexit",
    7,
    RejectKind::MapHelperMismatch { .. }
);
accept!(
    ringbuf_output_ok,
    "stdw [%r10-8], 0\nmov %r2, %r10\nadd %r2, -8\nmov %r3, 8\nmov %r4, 0\nldmap %r1, 3\ncall 130\nexit"
);
accept!(
    perf_event_output_ok,
    "stdw [%r10-8], 0\nmov %r4, %r10\nadd %r4, -8\nmov %r5, 8\nmov %r3, 0\nldmap %r2, 4\ncall 25\nexit"
);
reject!(
    perf_event_output_needs_perf_array,
    "stdw [%r10-8], 0\nmov %r4, %r10\nadd %r4, -8\nmov %r5, 8\nmov %r3, 0\nldmap %r2, 1\ncall 25\nexit",
    7,
    RejectKind::MapHelperMismatch { .. }
);
reject!(
    perf_event_output_size_too_big,
    "stdw [%r10-8], 0\nmov %r4, %r10\nadd %r4, -8\nmov %r5, 16\nmov %r3, 0\nldmap %r2, 4\ncall 25\nexit",
    7,
    RejectKind::StackUninitRead { .. } | RejectKind::StackOutOfBounds { .. }
);
reject!(
    helper_size_unbounded,
    "stdw [%r10-8], 0\nmov %r2, %r10\nadd %r2, -8\nldxdw %r3, [%r1]\nmov %r4, 0\nldmap %r1, 3\ncall 130\nexit",
    7,
    RejectKind::SizeNegative { reg: 3 }
);
reject!(
    helper_size_too_large,
    "stdw [%r10-8], 0\nmov %r2, %r10\nadd %r2, -8\nldxdw %r3, [%r1]\nrsh %r3, 1\nmov %r4, 0\nldmap %r1, 3\ncall 130\nexit",
    8,
    RejectKind::SizeUnbounded { reg: 3 }
);
accept!(
    tail_call_ok,
    "mov %r3, 0\nldmap %r2, 5\ncall 12\nmov %r0, 0\nexit"
);
reject!(
    tail_call_needs_prog_array,
    "mov %r3, 0\nldmap %r2, 2\ncall 12\nmov %r0, 0\nexit",
    3,
    RejectKind::MapHelperMismatch { .. }
);
accept!(
    queue_push,
    "stdw [%r10-8], 0\nmov %r2, %r10\nadd %r2, -8\nmov %r3, 0\nldmap %r1, 6\ncall 87\nexit"
);
accept!(
    queue_pop_into_uninit,
    "mov %r2, %r10\nadd %r2, -8\nldmap %r1, 6\ncall 88\nldxdw %r0, [%r10-8]\nexit"
);
reject!(
    lookup_on_queue,
    &LOOKUP
        .replace("ldmap %r1, 1", "ldmap %r1, 6")
        .to_string()
        .add_exit(),
    5,
    RejectKind::MapHelperMismatch { .. }
);
accept!(
    probe_read_fills_stack,
    "mov %r1, %r10\nadd %r1, -16\nmov %r2, 16\nmov %r3, 0\ncall 113\nldxdw %r0, [%r10-16]\nexit"
);
reject!(
    probe_read_zero_with_null_dst_but_nonzero_size,
    "mov %r1, 0\nmov %r2, 16\nmov %r3, 0\ncall 113\nexit",
    3,
    RejectKind::HelperArgType { reg: 1, .. }
);
reject!(
    get_current_comm_zero_size,
    "mov %r1, %r10\nadd %r1, -16\nmov %r2, 0\ncall 16\nexit",
    3,
    RejectKind::SizeZero { reg: 2 }
);
reject!(
    helper_needs_ctx,
    "mov %r3, 0\nldmap %r2, 8\nmov %r1, %r10\ncall 27\nexit",
    4,
    RejectKind::HelperArgType { reg: 1, .. }
);
accept!(get_stackid_ok, "mov %r3, 0\nldmap %r2, 8\ncall 27\nexit");

trait AddExit {
    fn add_exit(self) -> String;
}
impl AddExit for String {
    fn add_exit(self) -> String {
        self + "mov %r0, 0\nexit"
    }
}

// ---- ring buffer references ------------------------------------------------------

const RESERVE: &str = "ldmap %r1, 3\nmov %r2, 16\nmov %r3, 0\ncall 131\n";

accept!(ringbuf_reserve_submit, &format!("{RESERVE}jeq %r0, 0, +4\nstdw [%r0+8], 1\nmov %r1, %r0\nmov %r2, 0\ncall 132\nmov %r0, 0\nexit"));
accept!(
    ringbuf_reserve_discard,
    &format!("{RESERVE}jeq %r0, 0, +3\nmov %r1, %r0\nmov %r2, 0\ncall 133\nmov %r0, 0\nexit")
);
reject!(
    ringbuf_leak,
    &format!("{RESERVE}jeq %r0, 0, +1\nstdw [%r0], 1\nmov %r0, 0\nexit"),
    8,
    RejectKind::UnreleasedReference { alloc_insn: 4, .. }
);
reject!(
    ringbuf_write_past_record,
    &format!("{RESERVE}jeq %r0, 0, +4\nstdw [%r0+16], 1\nmov %r1, %r0\nmov %r2, 0\ncall 132\nmov %r0, 0\nexit"),
    6,
    RejectKind::RegionOutOfBounds { .. }
);
reject!(
    ringbuf_use_after_submit,
    &format!("{RESERVE}jeq %r0, 0, +5\nmov %r6, %r0\nmov %r1, %r0\nmov %r2, 0\ncall 132\nstdw [%r6], 1\nmov %r0, 0\nexit"),
    10,
    RejectKind::UninitRegister { reg: 6 }
);
reject!(
    ringbuf_double_submit,
    &format!("{RESERVE}jeq %r0, 0, +6\nmov %r6, %r0\nmov %r1, %r0\nmov %r2, 0\ncall 132\nmov %r1, %r6\ncall 132\nmov %r0, 0\nexit"),
    10,
    RejectKind::UninitRegister { reg: 6 }
);
reject!(
    ringbuf_submit_unchecked,
    &format!("{RESERVE}mov %r1, %r0\nmov %r2, 0\ncall 132\nmov %r0, 0\nexit"),
    7,
    RejectKind::BadRelease { reg: 1 }
);
reject!(
    ringbuf_reserve_size_variable,
    "ldxdw %r2, [%r1]\nand %r2, 8\nldmap %r1, 3\nmov %r3, 0\ncall 131\nmov %r0, 0\nexit",
    5,
    RejectKind::NotConstant { reg: 2 }
);

// ---- control flow --------------------------------------------------------------

reject!(
    jump_out_of_range,
    "ja +5\nmov %r0, 0\nexit",
    0,
    RejectKind::JumpOutOfRange { .. }
);
reject!(fall_off_end, "mov %r0, 0", 0, RejectKind::FallOffEnd);
reject!(
    unreachable_insn,
    "mov %r0, 0\nexit\nmov %r0, 1\nexit",
    2,
    RejectKind::Unreachable { insn: 2 }
);
reject!(
    jump_into_lddw,
    "ja +1\nlddw %r0, 1\nexit",
    0,
    RejectKind::JumpIntoLdImm64 { .. }
);
accept!(
    bounded_loop,
    "mov %r0, 0\nmov %r1, 0\nloop:\nadd %r0, 3\nadd %r1, 1\njlt %r1, 100, loop\nexit"
);
reject!(
    infinite_loop,
    "mov %r0, 0\nloop:\nja loop",
    1,
    RejectKind::InfiniteLoop { insn: 1 }
);
#[test]
fn rejection_log_names_the_source_line_of_the_failing_insn() {
    // Insn 2 fails (r3 is uninitialized); it belongs to the line starting at insn 1.
    let insns = asm("mov %r0, 0\nmov %r2, 1\nadd %r0, %r3\nexit");
    let info = ProgramInfo {
        insns: &insns,
        prog_type: prog_type::KPROBE,
        gpu: false,
        maps: &maps,
        mem_len: 0,
    };
    let line = |insn, line, text: &str| SourceLine {
        insn,
        file: "/src/dir/prog.bpf.c".into(),
        line,
        text: text.into(),
    };
    let opts = Options {
        source_lines: vec![
            line(0, 10, "\tint r = 0;"),
            line(1, 11, "  return r + x;"),
            line(3, 12, "}"),
        ],
        ..Options::default()
    };
    let e = verify(&info, &opts).unwrap_err();
    assert_eq!(e.insn, 2, "{}", e.log());
    let log = e.log();
    let src = log.find("; return r + x; @ prog.bpf.c:11\n").expect(&log);
    let insn = log.find("2: (0f) r0 += r3").expect(&log);
    assert!(src < insn, "{log}");
    // Without line info the log has no source line.
    let bare = verify(&info, &Options::default()).unwrap_err().log();
    assert!(!bare.contains("; "), "{bare}");
}

#[test]
fn unbounded_loop_hits_limit() {
    let insns = asm("mov %r0, 0\nmov %r1, 0\nloop:\nadd %r1, 1\njne %r1, 0, loop\nexit");
    let info = ProgramInfo {
        insns: &insns,
        prog_type: prog_type::KPROBE,
        gpu: false,
        maps: &maps,
        mem_len: 0,
    };
    let e = verify(
        &info,
        &Options {
            max_processed: 100_000,
            ..Options::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(e.kind, RejectKind::TooComplex { processed: 100_001 }),
        "{}",
        e.log()
    );
}
reject!(
    loop_on_unknown_data_loops_forever,
    "mov %r0, 0\nloop:\nldxdw %r2, [%r1]\njne %r2, 0, loop\nexit",
    1,
    RejectKind::InfiniteLoop { .. }
);
accept!(
    branch_pruning_keeps_it_linear,
    &(0..200)
        .map(|_| "ldxdw %r2, [%r1]\njeq %r2, 0, +1\nmov %r3, 1\n")
        .collect::<String>()
        .add_exit()
);
accept!(jmp32_refines, "ldxw %r2, [%r1]\njgt32 %r2, 15, +4\nmov %r3, %r10\nadd %r3, -16\nadd %r3, %r2\nstb [%r3], 0\nmov %r0, 0\nexit");

// ---- bpf-to-bpf calls ------------------------------------------------------------

accept!(
    subprog_call,
    "mov %r1, 5\nmov %r6, 9\ncall local f\nadd %r0, %r6\nexit\nf:\nmov %r0, %r1\nexit"
);
reject!(
    subprog_caller_r1_clobbered,
    "mov %r1, 5\ncall local f\nmov %r0, %r1\nexit\nf:\nmov %r0, 1\nexit",
    2,
    RejectKind::UninitRegister { reg: 1 }
);
reject!(
    subprog_cannot_read_callers_r6,
    "mov %r6, 5\ncall local f\nexit\nf:\nmov %r0, %r6\nexit",
    3,
    RejectKind::UninitRegister { reg: 6 }
);
accept!(
    subprog_writes_callers_stack,
    "mov %r1, %r10\nadd %r1, -8\ncall local f\nldxdw %r0, [%r10-8]\nexit\nf:\nstdw [%r1], 7\nmov %r0, 0\nexit"
);
reject!(
    subprog_returns_its_stack,
    "call local f\nmov %r0, 0\nexit\nf:\nmov %r0, %r10\nexit",
    4,
    RejectKind::ReturnStackPointer
);
reject!(
    subprog_recursion,
    "call local f\nexit\nf:\ncall local f\nmov %r0, 0\nexit",
    2,
    RejectKind::RecursiveCall { .. }
);
// A kprobe program's frames share one stack along each call chain (6.1 and 6.18
// give it no private stacks), checked after verification: the refusal names the
// call that entered the frame over the limit, each frame rounded to 32 bytes.
reject!(
    frames_share_one_stack,
    "stdw [%r10-512], 0\ncall local f\nmov %r0, 0\nexit\nf:\nstdw [%r10-512], 0\nmov %r0, 0\nexit",
    1,
    RejectKind::CombinedStackTooLarge {
        frames: 2,
        depth: 1024
    }
);
reject!(
    frames_are_rounded_to_32_bytes,
    "stdw [%r10-488], 0\ncall local f\nmov %r0, 0\nexit\nf:\nstdw [%r10-8], 0\nmov %r0, 0\nexit",
    1,
    RejectKind::CombinedStackTooLarge {
        frames: 2,
        depth: 544
    }
);
accept!(
    frames_within_512_bytes_together,
    "stdw [%r10-480], 0\ncall local f\nmov %r0, 0\nexit\nf:\nstdw [%r10-32], 0\nmov %r0, 0\nexit"
);
reject!(
    combined_stack_too_large,
    "mov %r6, %r1\nstdw [%r10-512], 0\ncall local f\nmov %r1, %r6\nldmap %r2, 5\nmov %r3, 0\ncall 12\nmov %r0, 0\nexit\nf:\nstdw [%r10-8], 0\nmov %r0, 0\nexit",
    2,
    RejectKind::CombinedStackTooLarge { .. }
);
// A tail call keeps its callers' frames: a subprogram that tail-calls must be
// entered with less than 256 bytes below it.
reject!(
    tail_call_under_deep_frames,
    "stdw [%r10-256], 0\ncall local f\nexit\nf:\nldmap %r2, 5\nmov %r3, 0\ncall 12\nmov %r0, 0\nexit",
    1,
    RejectKind::TailCallStackTooLarge { depth: 256 }
);
accept!(
    tail_call_under_shallow_frames,
    "stdw [%r10-224], 0\ncall local f\nexit\nf:\nldmap %r2, 5\nmov %r3, 0\ncall 12\nmov %r0, 0\nexit"
);

fn chain(n: usize) -> String {
    let mut s = String::from("call local f1\nmov %r0, 0\nexit\n");
    for k in 1..=n {
        if k < n {
            s.push_str(&format!("f{k}:\ncall local f{}\nmov %r0, 0\nexit\n", k + 1));
        } else {
            s.push_str(&format!("f{k}:\nmov %r0, 0\nexit\n"));
        }
    }
    s
}

#[test]
fn call_depth_eight_frames_ok_nine_rejected() {
    ok(&chain(7));
    let e = bad(&chain(8));
    assert!(
        matches!(e.kind, RejectKind::CallStackTooDeep { frames: 9 }),
        "{}",
        e.log()
    );
}

// ---- bpf_loop ------------------------------------------------------------------

accept!(
    bpf_loop_callback,
    "mov %r1, 10\nldfunc %r2, 6\nmov %r3, 0\nmov %r4, 0\ncall 181\nmov %r0, 0\nexit\ncb:\nmov %r0, 0\nexit"
);
reject!(
    bpf_loop_callback_bad_return,
    "mov %r1, 10\nldfunc %r2, 6\nmov %r3, 0\nmov %r4, 0\ncall 181\nmov %r0, 0\nexit\ncb:\nmov %r0, 2\nexit",
    9,
    RejectKind::CallbackReturnRange { .. }
);
accept!(
    bpf_loop_counter_on_callers_stack,
    "stdw [%r10-8], 0\nmov %r1, 10\nldfunc %r2, 7\nmov %r3, %r10\nadd %r3, -8\nmov %r4, 0\ncall 181\nldxdw %r0, [%r10-8]\nexit\ncb:\nldxdw %r3, [%r2]\nadd %r3, 1\nstxdw [%r2], %r3\nmov %r0, 0\nexit"
);
reject!(
    bpf_loop_callback_writes_past_ctx,
    "mov %r1, 10\nldfunc %r2, 7\nmov %r3, %r10\nadd %r3, -8\nmov %r4, 0\ncall 181\nmov %r0, 0\nexit\ncb:\nstdw [%r2+8], 0\nmov %r0, 0\nexit",
    9,
    RejectKind::StackOutOfBounds { .. }
);
reject!(
    bpf_loop_ctx_is_stack_or_null,
    "mov %r1, 10\nldfunc %r2, 6\nmov %r3, 1\nmov %r4, 0\ncall 181\nmov %r0, 0\nexit\ncb:\nmov %r0, 0\nexit",
    5,
    RejectKind::HelperArgType { reg: 3, .. }
);
// Equal states in later iterations of a callback are progress, not a loop.
accept!(
    bpf_loop_callback_without_progress,
    "stdw [%r10-8], 0\nmov %r1, 10\nldfunc %r2, 7\nmov %r3, %r10\nadd %r3, -8\nmov %r4, 0\ncall 181\nmov %r0, 0\nexit\ncb:\nldxdw %r3, [%r10-8]\nmov %r4, 0\nmov %r5, 0\nmov %r6, 0\nmov %r7, 0\nmov %r8, 0\nmov %r9, 0\nstxdw [%r2], %r3\nmov %r0, 0\nexit"
);
reject!(
    bpf_loop_needs_func,
    "mov %r1, 10\nmov %r2, 0\nmov %r3, 0\nmov %r4, 0\ncall 181\nmov %r0, 0\nexit",
    4,
    RejectKind::HelperArgType { reg: 2, .. }
);

// ---- atomics -------------------------------------------------------------------

accept!(
    atomic_add_on_stack,
    "stdw [%r10-8], 0\nmov %r1, 1\nlock add [%r10-8], %r1\nldxdw %r0, [%r10-8]\nexit"
);
accept!(
    atomic_on_uninit_stack,
    "mov %r1, 1\nlock add [%r10-8], %r1\nmov %r0, 0\nexit"
);
// A fetch returns what the slot held, a spilled pointer too.
accept!(
    atomic_fetch_returns_spilled_pointer,
    "stxdw [%r10-8], %r1\nmov %r2, 0\nlock fetch add [%r10-8], %r2\nldxdw %r0, [%r2]\nexit"
);
reject!(
    atomic_leaves_a_number,
    "stxdw [%r10-8], %r1\nmov %r2, 0\nlock add [%r10-8], %r2\nldxdw %r1, [%r10-8]\nldxdw %r0, [%r1]\nexit",
    4,
    RejectKind::InvalidMemAccess { reg: 1, .. }
);
reject!(
    atomic_on_ctx,
    "mov %r2, 1\nlock add [%r1], %r2\nmov %r0, 0\nexit",
    1,
    RejectKind::CtxAccess { .. }
);
accept!(
    atomic_fetch_on_map_value,
    &format!("{LOOKUP}jeq %r0, 0, +2\nmov %r1, 1\nlock fetch add [%r0], %r1\nmov %r0, 0\nexit")
);

// ---- GPU -----------------------------------------------------------------------

fn gpu(src: &str) -> Result<bpftime_verifier::Verified, bpftime_verifier::Rejection> {
    run_with(&asm(src), prog_type::KPROBE, true)
}

#[test]
fn gpu_allows_gpu_helpers_and_maps() {
    // The host process's pid and tgid, and random numbers, are GPU helpers too.
    gpu("call 14\ncall 7\nmov %r0, 0\nexit").unwrap();
    gpu("call 505\nmov %r0, 0\nexit").unwrap_err(); // 505 needs three pointers
    gpu("stdw [%r10-8], 0\nstdw [%r10-16], 0\nstdw [%r10-24], 0\nmov %r1, %r10\nadd %r1, -8\nmov %r2, %r10\nadd %r2, -16\nmov %r3, %r10\nadd %r3, -24\ncall 505\ncall 506\ncall 502\nmov %r0, 0\nexit")
        .unwrap();
    gpu(&LOOKUP.replace("ldmap %r1, 1", "ldmap %r1, 7").add_exit()).unwrap();
    // LRU hash maps, whose inserts evict on the GPU as in the kernel.
    gpu("stdw [%r10-8], 0\nmov %r2, %r10\nadd %r2, -8\nldmap %r1, 10\ncall 1\nmov %r0, 0\nexit")
        .unwrap();
}

#[test]
fn gpu_rejects_cpu_only_helpers_and_maps() {
    // get_current_comm: the GPU has no task to name.
    let e = gpu("mov %r1, %r10\nadd %r1, -16\nmov %r2, 16\ncall 16\nmov %r0, 0\nexit").unwrap_err();
    assert!(
        matches!(e.kind, RejectKind::HelperNotOnGpu { id: 16, .. }),
        "{}",
        e.log()
    );
    // Maps of maps: refused on the GPU, where inner maps have no replicas.
    let e = gpu("ldmap %r1, 9\nmov %r0, 0\nexit").unwrap_err();
    assert!(
        matches!(e.kind, RejectKind::MapTypeNotOnGpu { .. }),
        "{}",
        e.log()
    );
    // Queues and stack trace maps have no GPU replica either.
    for fd in [6, 8] {
        let e = gpu(&format!("ldmap %r1, {fd}\nmov %r0, 0\nexit")).unwrap_err();
        assert!(
            matches!(e.kind, RejectKind::MapTypeNotOnGpu { .. }),
            "{}",
            e.log()
        );
        assert_eq!(e.insn, 0);
    }
    let e = gpu(&format!("{RESERVE}mov %r0, 0\nexit")).unwrap_err();
    assert!(
        matches!(e.kind, RejectKind::HelperNotOnGpu { id: 131, .. }),
        "{}",
        e.log()
    );
}

// ---- conformance program type ----------------------------------------------------

#[test]
fn conformance_buffer_in_r1_length_in_r2() {
    let p = asm("ldxdw %r0, [%r1+56]\nstw [%r1], 1\nadd %r0, %r2\nexit");
    run_with(&p, PROG_TYPE_CONFORMANCE, false).unwrap();
    let p = asm("ldxdw %r0, [%r1+60]\nexit");
    let e = run_with(&p, PROG_TYPE_CONFORMANCE, false).unwrap_err();
    assert!(
        matches!(e.kind, RejectKind::RegionOutOfBounds { .. }),
        "{}",
        e.log()
    );
}

#[test]
fn unsupported_prog_type() {
    let e = run_with(&asm("mov %r0, 0\nexit"), prog_type::XDP, false).unwrap_err();
    assert!(matches!(e.kind, RejectKind::UnsupportedProgType { .. }));
}

// ---- log -----------------------------------------------------------------------

#[test]
fn log_names_insn_disassembly_and_reason() {
    let e = bad("mov %r0, 0\nmov %r0, 0\nmov %r0, 0\nmov %r0, 0\nmov %r0, 0\nmov %r0, 0\nmov %r0, 0\nmov %r0, 0\nmov %r0, 0\nmov %r0, 0\nmov %r0, 0\nmov %r0, 0\nldxw %r2, [%r1+200]\nexit");
    let log = e.log();
    assert!(
        log.ends_with(
            "12: (61) r2 = *(u32 *)(r1 +200)\ninvalid bpf_context access off=200 size=4\n"
        ),
        "{log}"
    );
    assert!(log.contains("R1=ctx(off=0)"), "{log}");
}

#[test]
fn verbose_log_only_when_asked() {
    let insns = asm("mov %r0, 0\nexit");
    let info = ProgramInfo {
        insns: &insns,
        prog_type: prog_type::KPROBE,
        gpu: false,
        maps: &maps,
        mem_len: 0,
    };
    let quiet = verify(&info, &Options::default()).unwrap();
    assert!(quiet.log.is_empty());
    let loud = verify(
        &info,
        &Options {
            log_level: 2,
            ..Options::default()
        },
    )
    .unwrap();
    assert!(
        loud.log.contains("0: (b7) r0 = 0 ; R1=ctx(off=0) R10=fp0"),
        "{}",
        loud.log
    );
    assert!(loud.log.contains("processed 2 insns"), "{}", loud.log);
}

#[test]
fn raw_insns_with_bad_register() {
    let insns = [
        Insn::new(0xb7, 11, 0, 0, 0),
        Insn::new(0xb7, 0, 0, 0, 0),
        Insn::new(0x95, 0, 0, 0, 0),
    ];
    let e = run_with(&insns, prog_type::KPROBE, false).unwrap_err();
    assert!(matches!(e.kind, RejectKind::InvalidRegister { reg: 11 }));
    assert!(e.log().contains("invalid register r11"), "{}", e.log());
}

/// Like the kernel, malformed fields are found where a path runs; only unknown
/// opcodes, loads and 64-bit immediates are refused wherever they are.
#[test]
fn dead_code_fields_are_not_judged_but_unknown_opcodes_are() {
    let exit_imm = Insn::new(0x95, 0, 0, 0, -1);
    // r0 is 0, so the branch always jumps over slot 2: no path runs it.
    let insns = [
        Insn::new(0xb7, 0, 0, 0, 0),
        Insn::new(0x15, 0, 0, 1, 0),
        exit_imm,
        Insn::new(0x95, 0, 0, 0, 0),
    ];
    run_with(&insns, prog_type::KPROBE, false).unwrap();
    let live = [Insn::new(0xb7, 0, 0, 0, 0), exit_imm];
    let e = run_with(&live, prog_type::KPROBE, false).unwrap_err();
    assert!(
        matches!(e.kind, RejectKind::ReservedFields { code: 0x95 }),
        "{}",
        e.log()
    );
    let unknown = [
        Insn::new(0xb7, 0, 0, 0, 0),
        Insn::new(0x15, 0, 0, 1, 0),
        Insn::new(0x8f, 0, 0, 0, 0),
        Insn::new(0x95, 0, 0, 0, 0),
    ];
    let e = run_with(&unknown, prog_type::KPROBE, false).unwrap_err();
    assert!(
        matches!(e.kind, RejectKind::UnknownOpcode { code: 0x8f }),
        "{}",
        e.log()
    );
}

accept!(
    void_subprog_leaves_r0_unset,
    "call local f\nmov %r0, 0\nexit\nf:\nstdw [%r10-8], 1\nexit"
);
reject!(
    void_subprog_r0_read_by_caller,
    "call local f\nexit\nf:\nmov %r1, 1\nexit",
    1,
    RejectKind::UninitRegister { reg: 0 }
);
reject!(
    callee_stack_pointer_into_callers_stack,
    "mov %r1, %r10\nadd %r1, -8\ncall local f\nldxdw %r1, [%r10-8]\nldxdw %r0, [%r1]\nexit\nf:\nstdw [%r10-8], 0\nmov %r2, %r10\nadd %r2, -8\nstxdw [%r1], %r2\nmov %r0, 0\nexit",
    9,
    RejectKind::StackPointerToCallerFrame
);
accept!(
    callee_number_into_callers_stack,
    "mov %r1, %r10\nadd %r1, -8\ncall local f\nldxdw %r0, [%r10-8]\nexit\nf:\nstdw [%r1], 7\nmov %r0, 0\nexit"
);

// ---- pruning ---------------------------------------------------------------------

const PAD: &str = "mov %r5, 0\nmov %r5, 0\nmov %r5, 0\nmov %r5, 0\nmov %r5, 0\nmov %r5, 0\nmov %r5, 0\nmov %r5, 0\n";

accept!(
    join_of_safe_paths_is_pruned,
    &format!("{PAD}ldxdw %r2, [%r1]\nmov %r3, 0\njeq %r2, 0, +1\nmov %r3, 8\nmov %r4, %r10\nadd %r4, -16\nadd %r4, %r3\nstdw [%r4], 0\nmov %r0, 0\nexit")
);
reject!(
    join_does_not_prune_a_wider_value,
    &format!("{PAD}ldxdw %r2, [%r1]\nmov %r3, 16\njeq %r2, 0, +1\nmov %r3, 0\nmov %r4, %r10\nadd %r4, -8\nadd %r4, %r3\nstdw [%r4], 0\nmov %r0, 0\nexit"),
    15,
    RejectKind::StackOutOfBounds { .. }
);
reject!(
    join_does_not_prune_null_into_checked,
    &format!("{LOOKUP}{PAD}mov %r6, %r0\njeq %r0, 0, +1\nmov %r7, 1\nldxdw %r0, [%r6]\nexit"),
    17,
    RejectKind::InvalidMemAccess { reg: 6, .. }
);

#[test]
fn diamonds_verify_in_linear_time() {
    let src: String =
        (0..500).map(|_| "ldxdw %r2, [%r1]\njeq %r2, 0, +1\nmov %r3, 1\nmov %r4, 2\nmov %r5, 3\nmov %r0, 4\nmov %r0, 5\nmov %r0, 6\n").collect();
    let v = ok(&src.add_exit());
    assert!(
        v.insns_processed < 8 * 500 * 2,
        "processed {}",
        v.insns_processed
    );
    assert!(v.pruned > 0);
}

accept!(
    narrow_spill_keeps_bounds,
    "ldxdw %r2, [%r1]\nand %r2, 7\nstxw [%r10-4], %r2\nstw [%r10-8], 0\nldxw %r3, [%r10-4]\nmov %r4, %r10\nadd %r4, -8\nadd %r4, %r3\nldxb %r0, [%r4]\nexit"
);
reject!(
    narrow_spill_truncates,
    "ldxdw %r2, [%r1]\nand %r2, 0x1ff\nstxb [%r10-1], %r2\nstdw [%r10-16], 0\nstdw [%r10-24], 0\nldxb %r3, [%r10-1]\nmov %r4, %r10\nadd %r4, -24\nadd %r4, %r3\nldxb %r0, [%r4]\nexit",
    9,
    RejectKind::StackOutOfBounds { .. } | RejectKind::StackUninitRead { .. }
);
reject!(
    narrow_fill_of_other_half_is_unknown,
    "ldxdw %r2, [%r1]\nand %r2, 7\nstxw [%r10-4], %r2\nstw [%r10-8], 1\nldxh %r3, [%r10-4]\nldxh %r3, [%r10-2]\nmov %r4, %r10\nadd %r4, %r3\nldxb %r0, [%r4]\nexit",
    8,
    RejectKind::StackOutOfBounds { .. }
);

reject!(
    bpf_loop_inside_infinite_loop,
    "loop:\nmov %r1, 1\nldfunc %r2, 5\nmov %r3, 0\nmov %r4, 0\ncall 181\nja loop\ncb:\nmov %r0, 0\nexit",
    0,
    RejectKind::InfiniteLoop { .. }
);

reject!(
    bpf_loop_callback_leaking_a_record,
    "mov %r1, 4\nldfunc %r2, 6\nmov %r3, 0\nmov %r4, 0\ncall 181\nmov %r0, 0\nexit\ncb:\nldmap %r1, 3\nmov %r2, 8\nmov %r3, 0\ncall 131\nmov %r0, 0\nexit",
    7,
    RejectKind::UnreleasedReference { .. }
);

reject!(
    stack_misaligned,
    "stdw [%r10-12], 0\nmov %r0, 0\nexit",
    0,
    RejectKind::MisalignedStackAccess { off: -12, size: 8 }
);
reject!(
    stack_partial_pointer_spill,
    "stxw [%r10-8], %r1\nmov %r0, 0\nexit",
    0,
    RejectKind::PartialPointerSpill { size: 4 }
);
#[test]
fn lddw_map_fd_with_high_half() {
    let mut p = asm("ldmap %r1, 1\nmov %r0, 0\nexit");
    p[1].imm = 4;
    let e = run_with(&p, prog_type::KPROBE, false).unwrap_err();
    assert_eq!((e.kind, e.insn), (RejectKind::InvalidLdImm64, 0));
}

#[test]
fn gpu_requires_aligned_map_value_access() {
    let src = "stw [%r10-4], 0\nmov %r2, %r10\nadd %r2, -4\nldmap %r1, 7\ncall 1\njeq %r0, 0, +1\nldxw %r0, [%r0+2]\nmov %r0, 0\nexit";
    run_with(&asm(src), prog_type::KPROBE, false).unwrap();
    let e = gpu(src).unwrap_err();
    assert_eq!(
        (e.kind, e.insn),
        (RejectKind::MisalignedAccess { off: 2, size: 4 }, 7)
    );
}

reject!(
    atomic_misaligned,
    &format!("{LOOKUP}jeq %r0, 0, +2\nmov %r1, 1\nlock add [%r0+4], %r1\nmov %r0, 0\nexit"),
    8,
    RejectKind::MisalignedAccess { off: 4, size: 8 }
);

reject!(
    shift_imm_past_width,
    "mov %r0, 1\nlsh32 %r0, 32\nexit",
    1,
    RejectKind::InvalidShift { imm: 32 }
);
reject!(
    shift_imm_negative,
    "mov %r0, 1\narsh %r0, -1\nexit",
    1,
    RejectKind::InvalidShift { imm: -1 }
);
accept!(
    shift_reg_past_width_is_masked,
    "mov %r0, 1\nmov %r1, 70\nlsh %r0, %r1\nexit"
);

#[test]
fn conformance_type_masks_immediate_shifts_like_the_isa() {
    run_with(
        &asm("mov %r0, 1\narsh32 %r0, 36\nexit"),
        PROG_TYPE_CONFORMANCE,
        false,
    )
    .unwrap();
}

#[test]
fn ja_with_imm_is_reserved() {
    let p = [
        Insn::new(0x05, 0, 0, 0, 3),
        Insn::new(0xb7, 0, 0, 0, 0),
        Insn::new(0x95, 0, 0, 0, 0),
    ];
    let e = run_with(&p, prog_type::KPROBE, false).unwrap_err();
    assert!(matches!(e.kind, RejectKind::ReservedFields { .. }));
}

// ---- found by the kernel differential corpus and its mutations -------------------

fn conformance(src: &str) -> Result<bpftime_verifier::Verified, bpftime_verifier::Rejection> {
    run_with(&asm(src), PROG_TYPE_CONFORMANCE, false)
}

// A byte swap has no source register: `be16` must not read r0 (a pointer here).
accept!(
    byte_swap_reads_no_source,
    "mov %r0, %r10\nmov %r9, 0x1234\nbe16 %r9\nmov %r0, %r9\nexit"
);
// `le64` in the 32-bit class still yields 64 bits: 0x100000000 is no small offset.
reject!(
    swap64_in_alu32_class_keeps_the_high_half,
    "lddw %r2, 0x100000000\nle64 %r2\nldmapval %r1, 11, 0\nadd %r1, %r2\nldxb %r0, [%r1]\nexit",
    5,
    RejectKind::UnboundedOffset { reg: 1 }
);
reject!(
    div_by_constant_zero,
    "ldxdw %r0, [%r1]\ndiv %r0, 0\nexit",
    1,
    RejectKind::DivByZero
);
reject!(
    smod32_by_constant_zero,
    "ldxdw %r0, [%r1]\nsmod32 %r0, 0\nexit",
    1,
    RejectKind::DivByZero
);
accept!(
    div_by_register_that_may_be_zero,
    "ldxdw %r0, [%r1]\nldxdw %r2, [%r1+8]\ndiv %r0, %r2\nexit"
);

#[test]
fn conformance_type_divides_by_zero_as_the_isa_defines() {
    conformance("mov %r0, 1\ndiv %r0, 0\nmod32 %r0, 0\nexit").unwrap();
}

#[test]
fn conformance_type_calls_a_helper_through_a_known_register() {
    conformance("mov %r1, 1\nmov %r2, 5\ncallx %r2\nmov %r0, 2\nexit").unwrap();
    let e = conformance("ldxdw %r2, [%r1]\ncallx %r2\nexit").unwrap_err();
    assert!(
        matches!(e.kind, RejectKind::NotConstant { reg: 2 }),
        "{}",
        e.log()
    );
    // Not an instruction of the kernel's ISA.
    let e = run("mov %r2, 5\ncallx %r2\nmov %r0, 0\nexit").unwrap_err();
    assert!(
        matches!(e.kind, RejectKind::UnknownOpcode { code: 0x8d }),
        "{}",
        e.log()
    );
}

// Submit, discard and tail calls return nothing: r0 is unreadable after them.
reject!(
    ringbuf_submit_leaves_r0_unset,
    &format!("{RESERVE}jeq %r0, 0, +4\nmov %r1, %r0\nmov %r2, 0\ncall 132\nexit\nmov %r0, 0\nexit"),
    9,
    RejectKind::UninitRegister { reg: 0 }
);
reject!(
    tail_call_leaves_r0_unset,
    "ldmap %r2, 5\nmov %r3, 0\ncall 12\nexit",
    4,
    RejectKind::UninitRegister { reg: 0 }
);
// A reservation of any constant size verifies: one the ring cannot hold fails
// at run time with NULL.
accept!(
    ringbuf_reserve_of_zero_bytes,
    "ldmap %r1, 3\nmov %r2, 0\nmov %r3, 0\ncall 131\njeq %r0, 0, +3\nmov %r1, %r0\nmov %r2, 0\ncall 133\nmov %r0, 0\nexit"
);
accept!(
    ringbuf_reserve_of_a_huge_size,
    "ldmap %r1, 3\nmov %r2, -1\nmov %r3, 0\ncall 131\njeq %r0, 0, +4\nstdw [%r0+4096], 1\nmov %r1, %r0\nmov %r2, 0\ncall 133\nmov %r0, 0\nexit"
);
// An array lookup with a constant key below max_entries cannot miss.
accept!(
    array_lookup_with_constant_key_needs_no_null_check,
    "stw [%r10-8], 63\nmov %r2, %r10\nadd %r2, -8\nldmap %r1, 2\ncall 1\nldxdw %r0, [%r0]\nexit"
);
reject!(
    array_lookup_with_key_past_the_end_may_miss,
    "stw [%r10-8], 64\nmov %r2, %r10\nadd %r2, -8\nldmap %r1, 2\ncall 1\nldxdw %r0, [%r0]\nexit",
    6,
    RejectKind::InvalidMemAccess { reg: 0, .. }
);
reject!(
    hash_lookup_with_constant_key_may_miss,
    "stw [%r10-8], 0\nmov %r2, %r10\nadd %r2, -8\nldmap %r1, 1\ncall 1\nldxdw %r0, [%r0]\nexit",
    6,
    RejectKind::InvalidMemAccess { reg: 0, .. }
);
// Privileged programs may turn pointers into numbers...
accept!(
    pointer_difference_across_regions,
    "mov %r2, %r10\nsub %r2, %r1\nmov %r0, %r2\nexit"
);
accept!(
    pointer_negated_is_a_number,
    "mov %r2, %r10\nneg %r2\nmov %r0, %r2\nexit"
);
reject!(
    negated_pointer_is_not_a_pointer,
    "mov %r2, %r10\nneg %r2\nneg %r2\nstdw [%r2-8], 0\nmov %r0, 0\nexit",
    3,
    RejectKind::InvalidMemAccess { reg: 2, .. }
);
// ...but never subtract from a stack pointer.
reject!(
    subtraction_from_stack_pointer,
    "mov %r2, %r10\nsub %r2, 8\nstdw [%r2], 0\nmov %r0, 0\nexit",
    1,
    RejectKind::PtrOpProhibited { reg: 2, .. }
);
// The context for bpf_loop's callback: nothing runs it when the count is 0.
accept!(
    bpf_loop_of_zero_iterations_skips_the_callback,
    "mov %r1, 0\nldfunc %r2, 6\nmov %r3, 0\nmov %r4, 0\ncall 181\nmov %r0, 0\nexit\ncb:\nmov %r0, %r5\nexit"
);
reject!(
    bpf_loop_of_one_iteration_runs_the_callback,
    "mov %r1, 1\nldfunc %r2, 6\nmov %r3, 0\nmov %r4, 0\ncall 181\nmov %r0, 0\nexit\ncb:\nmov %r0, %r5\nexit",
    8,
    RejectKind::UninitRegister { reg: 5 }
);
// A 32-bit comparison that its subregister decides prunes the other way.
accept!(
    jmp32_decided_by_the_subregister,
    "ldxdw %r1, [%r1]\njgt32 %r1, -1, +1\nmov %r2, 0\nmov %r0, %r2\nexit"
);
// Every offset a variable stack pointer may hold must be aligned.
accept!(
    variable_stack_offset_aligned,
    "stdw [%r10-64], 0\nstdw [%r10-56], 0\nldxdw %r2, [%r1]\nand %r2, 8\nmov %r3, %r10\nadd %r3, -64\nadd %r3, %r2\nldxdw %r0, [%r3]\nexit"
);
reject!(
    variable_stack_offset_misaligned,
    "stdw [%r10-64], 0\nstdw [%r10-56], 0\nldxdw %r2, [%r1]\nand %r2, 8\nmov %r3, %r10\nadd %r3, -64\nadd %r3, %r2\nldxdw %r0, [%r3+4]\nexit",
    7,
    RejectKind::MisalignedStackAccess { .. }
);
// A string read returns at most its size (or a negative errno).
accept!(
    string_read_length_bounds_an_index,
    "ldxdw %r3, [%r1+112]\nmov %r1, %r10\nadd %r1, -16\nmov %r2, 16\ncall 114\njslt %r0, 1, +4\nmov %r1, %r10\nadd %r1, -17\nadd %r1, %r0\nldxb %r0, [%r1]\nmov %r0, 0\nexit"
);
// A 4-byte fill of a spilled number's low half keeps its bounds.
accept!(
    narrow_fill_of_a_spilled_number,
    "ldxdw %r6, [%r1]\nand %r6, 15\nstxdw [%r10-8], %r6\nldxw %r6, [%r10-8]\nldmapval %r1, 11, 0\nadd %r1, %r6\nldxb %r0, [%r1]\nexit"
);
// A loop that counts matches from an unknown start and remembers the last
// position: without widening the drifting count, its states multiply.
#[test]
fn loop_with_a_drifting_count_stays_within_budget() {
    let v = ok("ldxw %r2, [%r1]\nmov %r6, 0\nloop:\nldxdw %r3, [%r1+16]\nand %r3, 1\njeq %r3, 0, +2\nadd %r2, 1\nstxdw [%r10-8], %r6\nadd %r6, 1\njlt %r6, 40, loop\nmov %r0, 0\nexit");
    assert!(
        v.insns_processed < 200_000,
        "{} insns processed",
        v.insns_processed
    );
}
// Like the kernel, no bounds survive division, modulo or a shift by an amount
// not known to be in range (even where they could be known).
reject!(
    modulo_leaves_no_bounds,
    "ldxdw %r6, [%r1]\nmod %r6, 16\nldmapval %r1, 11, 0\nadd %r1, %r6\nldxb %r0, [%r1]\nexit",
    4,
    RejectKind::UnboundedOffset { reg: 1 }
);
reject!(
    variable_shift_leaves_no_bounds,
    "ldxdw %r7, [%r1]\nmov %r6, 0\nrsh %r6, %r7\nldmapval %r1, 11, 0\nadd %r1, %r6\nldxb %r0, [%r1]\nexit",
    5,
    RejectKind::UnboundedOffset { reg: 1 }
);
accept!(
    shift_by_a_known_register_keeps_bounds,
    "mov %r7, 2\nmov %r6, 3\nlsh %r6, %r7\nldmapval %r1, 11, 0\nadd %r1, %r6\nldxb %r0, [%r1]\nexit"
);
// Like the kernel: a map is never null, a context or stack pointer might be as
// far as a comparison with 0 goes (both ways are explored).
accept!(
    map_pointer_is_never_null,
    "ldmap %r2, 2\njne %r2, 0, +1\nmov %r0, %r5\nmov %r0, 0\nexit"
);
reject!(
    stack_pointer_compared_with_zero_explores_both_ways,
    "mov %r2, %r10\njne %r2, 0, +1\nmov %r0, %r5\nmov %r0, 0\nexit",
    2,
    RejectKind::UninitRegister { reg: 5 }
);
// An empty stack range handed to a helper must still start inside the frame.
accept!(
    helper_empty_range_inside_the_frame,
    "ldmap %r2, 4\nlddw %r3, 0xffffffff\nmov %r4, %r10\nadd %r4, -8\nmov %r5, 0\ncall 25\nmov %r0, 0\nexit"
);
reject!(
    helper_empty_range_at_the_frame_pointer,
    "ldmap %r2, 4\nlddw %r3, 0xffffffff\nmov %r4, %r10\nmov %r5, 0\ncall 25\nmov %r0, 0\nexit",
    6,
    RejectKind::StackOutOfBounds { off: 0, size: 0 }
);

// ---- tracepoint contexts -----------------------------------------------------------

fn verify_as(
    prog_type: u32,
    src: &str,
) -> Result<bpftime_verifier::Verified, bpftime_verifier::Rejection> {
    run_with(&asm(src), prog_type, false)
}

/// The furthest byte a program loads from its context is what a tracepoint's record
/// size (or a raw tracepoint's argument count) is checked against at attach.
#[test]
fn tracepoint_programs_report_how_far_into_their_record_they_read() {
    let tp = prog_type::TRACEPOINT;
    let v = verify_as(
        tp,
        "ldxw %r0, [%r1+8]\nldxdw %r2, [%r1+40]\nldxb %r3, [%r1+17]\nexit",
    )
    .unwrap();
    assert_eq!(v.ctx_read_end, 48);
    // The record handed to a helper is not a load of it (the kernel's max_ctx_offset
    // counts loads only).
    let v = verify_as(tp, "ldxw %r0, [%r1+8]\nexit").unwrap();
    assert_eq!(v.ctx_read_end, 12);
    let raw = prog_type::RAW_TRACEPOINT;
    assert_eq!(
        verify_as(raw, "ldxdw %r0, [%r1+8]\nexit")
            .unwrap()
            .ctx_read_end,
        16
    );
    for (prog_type, src, off) in [
        (tp, "ldxdw %r0, [%r1+0]\nexit", 0),
        (tp, "ldxdw %r0, [%r1-8]\nexit", -8),
        (tp, "ldxdw %r0, [%r1+2048]\nexit", 2048),
        (raw, "ldxdw %r0, [%r1+96]\nexit", 96),
        (raw, "stdw [%r1+8], 0\nmov %r0, 0\nexit", 8),
    ] {
        let e = verify_as(prog_type, src).unwrap_err();
        assert!(
            matches!(e.kind, RejectKind::CtxAccess { off: o, .. } if o == off),
            "{src}: {}",
            e.log()
        );
    }
    // Other program types stay refused.
    let e = verify_as(prog_type::XDP, "mov %r0, 0\nexit").unwrap_err();
    assert!(
        matches!(e.kind, RejectKind::UnsupportedProgType { .. }),
        "{}",
        e.log()
    );
}
