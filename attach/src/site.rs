//! Which patch an address inside a binary can take: the 5-byte jump where nothing else
//! can land in the bytes it replaces, a one-byte breakpoint everywhere else.
//!
//! A function's entry is reached only by calls and jumps to it, so the jump is safe there.
//! Inside a function (a USDT site, `function+offset`), the bytes after the probed
//! instruction may be a loop head, a branch target or a return address. The function's code
//! is read from the file (not from memory, where other hooks may be) and decoded whole; the
//! jump is chosen only when no direct branch, call return or address taken in it points
//! into those bytes, no indirect jump leaves the function's targets unknown, and no
//! `endbr64` (the mark of an indirect branch or landing pad target under CET) sits there.
//! Landing pads of binaries built without CET are not visible this way; C++ code that
//! throws through a probed site in a function with indirect branches gets a breakpoint
//! anyway.

use std::path::Path;

use goblin::elf::section_header::SHN_UNDEF;
use goblin::elf::sym::STT_FUNC;
use goblin::elf::Elf;
use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind};

use crate::error::AttachError;
use crate::hook::HookAddress;
use crate::patch::JMP_LEN;
use crate::resolve::{vaddr_of, with_elf};

/// How a hook at a file offset of a binary is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SitePlan {
    /// The first instruction of a function: a jump, with the entry stub that skips the
    /// dead flags.
    FunctionEntry,
    /// Inside a function, where the jump replaces nothing another path can reach.
    Jump,
    /// A one-byte breakpoint; the reason the jump would not be safe.
    Breakpoint(String),
}

impl SitePlan {
    /// The hook address for this plan at runtime address `addr`.
    pub fn at(&self, addr: usize) -> HookAddress {
        match self {
            SitePlan::FunctionEntry => HookAddress::function_entry(addr),
            SitePlan::Jump => HookAddress::instruction(addr),
            SitePlan::Breakpoint(_) => HookAddress::breakpoint(addr),
        }
    }
}

/// A function symbol of the binary: its address range in the file's virtual addresses.
struct Function<'a> {
    name: &'a str,
    start: u64,
    end: u64,
}

fn function_holding<'a>(elf: &'a Elf<'_>, vaddr: u64) -> Option<Function<'a>> {
    let named = |sym: goblin::elf::Sym, name: Option<&'a str>| {
        (sym.st_type() == STT_FUNC
            && sym.st_shndx != SHN_UNDEF as usize
            && sym.st_value <= vaddr
            && (vaddr < sym.st_value + sym.st_size || sym.st_value == vaddr))
            .then(|| Function {
                name: name.unwrap_or("?"),
                start: sym.st_value,
                end: sym.st_value + sym.st_size,
            })
    };
    elf.syms
        .iter()
        .find_map(|s| named(s, elf.strtab.get_at(s.st_name)))
        .or_else(|| {
            elf.dynsyms
                .iter()
                .find_map(|s| named(s, elf.dynstrtab.get_at(s.st_name)))
        })
}

/// The function of `binary` that holds file offset `file_offset`, as its symbol names it
/// (mangled, as written), and how far into it the offset is; `None` when no function
/// symbol covers it (a stripped binary past its exported functions).
pub fn function_at(binary: &Path, file_offset: u64) -> Result<Option<(String, u64)>, AttachError> {
    crate::resolve::with_elf(binary, |_, _, elf| {
        let Some(vaddr) = crate::resolve::vaddr_of(elf, file_offset) else {
            return Ok(None);
        };
        Ok(function_holding(elf, vaddr).map(|f| (f.name.to_string(), vaddr - f.start)))
    })
}

/// Decides the patch for file offset `file_offset` of `binary` (see the module's doc). An
/// offset that is not where an instruction of its function starts is an error: the kernel
/// would put its breakpoint there and corrupt the code.
pub fn plan_site(binary: &Path, file_offset: u64) -> Result<SitePlan, AttachError> {
    with_elf(binary, |path, bytes, elf| {
        let Some(vaddr) = vaddr_of(elf, file_offset) else {
            return Ok(SitePlan::Breakpoint(
                "no loadable segment of the file holds the offset".into(),
            ));
        };
        let Some(f) = function_holding(elf, vaddr) else {
            return Ok(SitePlan::Breakpoint("no function symbol holds it".into()));
        };
        if f.start == vaddr {
            return Ok(SitePlan::FunctionEntry);
        }
        // The function's bytes, from the file: its start lies in the same segment.
        let start_offset = file_offset - (vaddr - f.start);
        let len = (f.end - f.start) as usize;
        let Some(code) = bytes.get(start_offset as usize..start_offset as usize + len) else {
            return Ok(SitePlan::Breakpoint(format!(
                "`{}` is not wholly in the file",
                f.name
            )));
        };
        let plan =
            plan_inside(code, f.start, vaddr).map_err(|nearest| AttachError::NotAnInstruction {
                binary: path.to_path_buf(),
                offset: file_offset,
                function: f.name.to_owned(),
                function_offset: vaddr - f.start,
                nearest: nearest
                    .iter()
                    .map(|v| format!("{}+{:#x}", f.name, v - f.start))
                    .collect::<Vec<_>>()
                    .join(" or "),
            })?;
        Ok(plan)
    })
}

/// The plan for `vaddr` inside the function whose code `code` starts at `start`; on error,
/// the instruction starts on either side of `vaddr`.
fn plan_inside(code: &[u8], start: u64, vaddr: u64) -> Result<SitePlan, Vec<u64>> {
    let all: Vec<Instruction> = Decoder::with_ip(64, code, start, DecoderOptions::NONE)
        .into_iter()
        .collect();
    let Some(i) = all.iter().position(|ins| ins.ip() == vaddr) else {
        let before = all
            .iter()
            .rev()
            .find(|ins| ins.ip() < vaddr)
            .map(|i| i.ip());
        let after = all.iter().find(|ins| ins.ip() > vaddr).map(|i| i.ip());
        return Err(before.into_iter().chain(after).collect());
    };
    // The instructions the jump would replace.
    let mut end = vaddr;
    let mut covered = i;
    while end < vaddr + JMP_LEN as u64 {
        let Some(ins) = all.get(covered) else {
            return Ok(SitePlan::Breakpoint(
                "the function ends within 5 bytes of it".into(),
            ));
        };
        if ins.is_invalid() {
            return Ok(SitePlan::Breakpoint(
                "the code after it does not decode".into(),
            ));
        }
        end = ins.next_ip();
        covered += 1;
    }
    let inside = |t: u64| t > vaddr && t < end;
    for ins in &all {
        if ins.is_invalid() {
            return Ok(SitePlan::Breakpoint(format!(
                "the function holds bytes that do not decode at {:#x}",
                ins.ip()
            )));
        }
        if (vaddr..end).contains(&ins.ip()) {
            if ins.ip() > vaddr && ins.mnemonic() == Mnemonic::Endbr64 {
                return Ok(SitePlan::Breakpoint(format!(
                    "an indirect branch target (endbr64) is at {:#x}",
                    ins.ip()
                )));
            }
            // A call among the replaced instructions but the last returns into them.
            let calls = matches!(
                ins.flow_control(),
                FlowControl::Call | FlowControl::IndirectCall
            );
            if calls && inside(ins.next_ip()) {
                return Ok(SitePlan::Breakpoint(format!(
                    "the call at {:#x} returns into the bytes a jump replaces",
                    ins.ip()
                )));
            }
        }
        match ins.flow_control() {
            FlowControl::IndirectBranch => {
                return Ok(SitePlan::Breakpoint(format!(
                    "the indirect jump at {:#x} may land anywhere in the function",
                    ins.ip()
                )))
            }
            FlowControl::UnconditionalBranch
            | FlowControl::ConditionalBranch
            | FlowControl::Call
                if ins.op0_kind() == OpKind::NearBranch64 && inside(ins.near_branch64()) =>
            {
                return Ok(SitePlan::Breakpoint(format!(
                    "the branch at {:#x} lands in the bytes a jump replaces",
                    ins.ip()
                )))
            }
            _ => {}
        }
        if ins.is_ip_rel_memory_operand() && inside(ins.ip_rel_memory_address()) {
            return Ok(SitePlan::Breakpoint(format!(
                "the instruction at {:#x} takes an address in the bytes a jump replaces",
                ins.ip()
            )));
        }
    }
    Ok(SitePlan::Jump)
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: u64 = 0x1000;

    #[test]
    fn straight_line_code_takes_the_jump() {
        // push rbp; nop; mov eax, 1; add eax, 2; pop rbp; ret
        let code = [0x55, 0x90, 0xb8, 1, 0, 0, 0, 0x83, 0xc0, 2, 0x5d, 0xc3];
        assert_eq!(plan_inside(&code, AT, AT + 1), Ok(SitePlan::Jump));
    }

    #[test]
    fn a_loop_head_in_the_replaced_bytes_takes_a_breakpoint() {
        // nop; xor eax, eax; L: inc eax; cmp eax, 10; jne L; ret
        let code = [
            0x90, 0x31, 0xc0, 0xff, 0xc0, 0x83, 0xf8, 0x0a, 0x75, 0xf9, 0xc3,
        ];
        let plan = plan_inside(&code, AT, AT).unwrap();
        assert!(
            matches!(plan, SitePlan::Breakpoint(ref why) if why.contains("lands")),
            "{plan:?}"
        );
        // Probing the loop head itself is fine: the jump starts there.
        assert_eq!(plan_inside(&code, AT, AT + 3), Ok(SitePlan::Jump));
    }

    #[test]
    fn indirect_jumps_and_short_tails_take_a_breakpoint() {
        // nop; mov eax, 1; jmp rax; ret
        let code = [0x90, 0xb8, 1, 0, 0, 0, 0xff, 0xe0, 0xc3];
        let plan = plan_inside(&code, AT, AT).unwrap();
        assert!(
            matches!(plan, SitePlan::Breakpoint(ref why) if why.contains("indirect")),
            "{plan:?}"
        );
        // nop; ret: no 5 bytes to replace.
        let plan = plan_inside(&[0x90, 0xc3], AT, AT).unwrap();
        assert!(matches!(plan, SitePlan::Breakpoint(_)), "{plan:?}");
    }

    #[test]
    fn a_call_returning_into_the_replaced_bytes_takes_a_breakpoint() {
        // nop; call rax; nop; nop; nop; ret
        let code = [0x90, 0xff, 0xd0, 0x90, 0x90, 0x90, 0xc3];
        let plan = plan_inside(&code, AT, AT).unwrap();
        assert!(
            matches!(plan, SitePlan::Breakpoint(ref why) if why.contains("returns")),
            "{plan:?}"
        );
    }

    #[test]
    fn an_offset_inside_an_instruction_is_named_with_its_neighbours() {
        // mov eax, 1; ret
        let code = [0xb8, 1, 0, 0, 0, 0xc3];
        assert_eq!(plan_inside(&code, AT, AT + 2), Err(vec![AT, AT + 5]));
    }
}
