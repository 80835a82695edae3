//! IR-building helpers that the lowering and the folds both use.

use inkwell::builder::Builder;
use inkwell::intrinsics::Intrinsic;
use inkwell::module::Module;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{FunctionValue, IntValue};

use crate::CompileError;

/// Looks up a (non-overloaded unless `overloads` says so) intrinsic.
pub fn intrinsic<'ctx>(
    module: &Module<'ctx>,
    name: &str,
    overloads: &[BasicTypeEnum<'ctx>],
) -> Result<FunctionValue<'ctx>, CompileError> {
    Intrinsic::find(name)
        .and_then(|i| i.get_declaration(module, overloads))
        .ok_or_else(|| CompileError::Intrinsic {
            name: name.to_string(),
        })
}

/// Calls `f` with `args` and returns its integer result.
pub fn call_int<'ctx>(
    builder: &Builder<'ctx>,
    f: FunctionValue<'ctx>,
    args: &[inkwell::values::BasicMetadataValueEnum<'ctx>],
    name: &str,
) -> Result<IntValue<'ctx>, CompileError> {
    builder
        .build_call(f, args, name)?
        .try_as_basic_value()
        .basic()
        .map(|v| v.into_int_value())
        .ok_or_else(|| CompileError::InvalidIr {
            message: format!("{} returns nothing", f.get_name().to_string_lossy()),
        })
}
