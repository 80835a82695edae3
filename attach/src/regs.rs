/// The kernel's x86-64 `struct pt_regs`, field for field, so that a program compiled with
/// libbpf's `PT_REGS_PARM1(ctx)`, `PT_REGS_RC(ctx)`, `PT_REGS_IP(ctx)` and `PT_REGS_SP(ctx)`
/// reads the right slot when this struct is its context.
///
/// At a uprobe, every register is its value at the probed instruction, `ip` is the probed
/// address and `sp` the stack pointer there (at a function entry, `[sp]` is the return address).
/// At a uretprobe, registers are their values just after the function returned (`ax`, `dx`
/// hold the return value), `sp` is the caller's stack pointer after the return, and `ip` is the
/// return address, as the kernel reports it (it sets `ip` to the original return address before
/// running uretprobe programs). `cs`, `ss` are the user-mode selectors, `orig_ax` is -1 (no
/// system call), as the kernel shows them at a uprobe.
///
/// Handlers may change general registers and `flags`; the change takes effect when the hooked
/// code resumes. Changes to `ip`, `sp`, `cs`, `ss` and `orig_ax` are ignored.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PtRegs {
    pub r15: u64,
    pub r14: u64,
    pub r13: u64,
    pub r12: u64,
    pub bp: u64,
    pub bx: u64,
    pub r11: u64,
    pub r10: u64,
    pub r9: u64,
    pub r8: u64,
    pub ax: u64,
    pub cx: u64,
    pub dx: u64,
    pub si: u64,
    pub di: u64,
    pub orig_ax: u64,
    pub ip: u64,
    pub cs: u64,
    pub flags: u64,
    pub sp: u64,
    pub ss: u64,
}

// The assembly stubs address fields by these offsets; a reordering must fail the build.
const _: () = {
    assert!(std::mem::size_of::<PtRegs>() == 21 * 8);
    assert!(std::mem::offset_of!(PtRegs, bx) == 40);
    assert!(std::mem::offset_of!(PtRegs, ax) == 80);
    assert!(std::mem::offset_of!(PtRegs, di) == 112);
    assert!(std::mem::offset_of!(PtRegs, ip) == 128);
    assert!(std::mem::offset_of!(PtRegs, flags) == 144);
    assert!(std::mem::offset_of!(PtRegs, sp) == 152);
    assert!(std::mem::offset_of!(PtRegs, ss) == 160);
};

impl PtRegs {
    /// The `n`th integer argument (1-based) at a function entry under the SysV ABI, as
    /// `PT_REGS_PARMn` reads it; `None` past the sixth, which lives on the stack.
    pub fn arg(&self, n: usize) -> Option<u64> {
        match n {
            1 => Some(self.di),
            2 => Some(self.si),
            3 => Some(self.dx),
            4 => Some(self.cx),
            5 => Some(self.r8),
            6 => Some(self.r9),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_kernel_uapi_offsets() {
        // Offsets from arch/x86/include/uapi/asm/ptrace.h (R15 = 0 ... SS = 160).
        assert_eq!(std::mem::offset_of!(PtRegs, r15), 0);
        assert_eq!(std::mem::offset_of!(PtRegs, bp), 32);
        assert_eq!(std::mem::offset_of!(PtRegs, r11), 48);
        assert_eq!(std::mem::offset_of!(PtRegs, r8), 72);
        assert_eq!(std::mem::offset_of!(PtRegs, cx), 88);
        assert_eq!(std::mem::offset_of!(PtRegs, dx), 96);
        assert_eq!(std::mem::offset_of!(PtRegs, si), 104);
        assert_eq!(std::mem::offset_of!(PtRegs, orig_ax), 120);
        assert_eq!(std::mem::offset_of!(PtRegs, cs), 136);
    }

    #[test]
    fn args_follow_the_sysv_order() {
        let r = PtRegs {
            di: 1,
            si: 2,
            dx: 3,
            cx: 4,
            r8: 5,
            r9: 6,
            ..Default::default()
        };
        let got: Vec<_> = (1..=7).map(|n| r.arg(n)).collect();
        assert_eq!(
            got,
            vec![Some(1), Some(2), Some(3), Some(4), Some(5), Some(6), None]
        );
    }
}
