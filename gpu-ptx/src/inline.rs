//! Probe bodies spliced in place of their calls.
//!
//! A spliced `call` is a real call in the machine code (ptxas does not inline `.func`s):
//! the kernel's live registers are saved around it and its loads wait, which costs a
//! memory-bound kernel about its own run time when a probe sits at every load (a
//! memory-access probe that does nothing made vectorAdd 2x slower on an H100). Putting
//! the probe's body where the call was lets ptxas allocate and schedule the two as one.
//!
//! A probe function as `bpftime-jit-ptx` writes it has one body: `.reg` declarations,
//! parameter loads (`ld.param.T %r, [SYMBOL_param_I+OFF]`), its code, and `ret` after
//! storing `func_retval0`. An instance of it at one site is a block that declares the
//! same registers under names of its own, reads its parameters from the site's
//! argument registers (`%__bta0`..), turns each `ret` into a branch to its end, and
//! renames its labels and local arrays, so that any number of instances live in one
//! kernel. Calls it makes to other functions (runtime helpers LLVM kept out of line)
//! stay calls. A body this module does not understand is not inlined: the site keeps
//! its call.

/// The register a kernel with inlined probes reads its SM's id into once, at entry
/// ([`InlineBody::reads_sm`]): each instance reads it in place of `%smid`.
pub const SM_REGISTER: &str = "%__bt_smid";

/// Bodies longer than this many statements stay out of line: each site gets a copy.
pub const MAX_INLINE_STATEMENTS: usize = 3000;

/// Statements inlined into one module at most: past them, sites keep their calls, so a
/// kernel with thousands of accesses does not multiply the driver's JIT time.
pub const MODULE_INLINE_BUDGET: usize = 60_000;

/// A probe function's body, ready to be instantiated at call sites.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InlineBody {
    symbol: String,
    /// The body's lines, without the braces.
    lines: Vec<String>,
    /// Register names and `%name<N>` prefixes the body declares.
    registers: Vec<String>,
    /// Whether it reads `%smid` ([`InlineBody::reads_sm`]).
    reads_sm: bool,
}

impl InlineBody {
    /// The body of `.func (.param .b64 func_retval0) SYMBOL(..) { .. }` in `ptx`, if
    /// there is one this module can inline.
    pub fn find(ptx: &str, symbol: &str) -> Option<InlineBody> {
        let head = ptx.match_indices(symbol).map(|(at, _)| at).find(|&at| {
            let line_start = ptx[..at].rfind('\n').map_or(0, |n| n + 1);
            ptx[line_start..at].contains(".func") && ptx[at + symbol.len()..].starts_with('(')
        })?;
        let open = head + ptx[head..].find('{')?;
        // The parameter list holds no braces; the body's braces nest (call sequences).
        let mut depth = 0usize;
        let mut close = None;
        for (i, c) in ptx[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(open + i);
                        break;
                    }
                }
                _ => {}
            }
        }
        let body = &ptx[open + 1..close?];
        let lines: Vec<String> = body
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("//"))
            .map(str::to_string)
            .collect();
        if lines.len() > MAX_INLINE_STATEMENTS {
            return None;
        }
        let mut registers = Vec::new();
        for l in &lines {
            let Some(rest) = l.strip_prefix(".reg") else {
                continue;
            };
            let names = rest.trim_end_matches(';');
            for word in names.split([' ', '\t', ',']).filter(|w| w.starts_with('%')) {
                let name = word.split('<').next().unwrap_or(word);
                registers.push(name.to_string());
            }
        }
        // What this module rewrites must be all there is to rewrite.
        for l in &lines {
            let returns = l.contains("func_retval0");
            let reads_param = l.contains(&format!("{symbol}_param_"));
            if returns && !l.starts_with("st.param.b64") {
                return None;
            }
            if reads_param && !l.starts_with("ld.param.") {
                return None;
            }
            if l.starts_with(".shared") || l.starts_with(".global") || l.starts_with(".const") {
                return None;
            }
        }
        let reads_sm = lines.iter().any(|l| {
            l.split(|c: char| !(is_name_byte(c as u8) || c == '%'))
                .any(|w| w == "%smid")
        });
        Some(InlineBody {
            symbol: symbol.to_string(),
            lines,
            registers,
            reads_sm,
        })
    }

    /// Whether the body calls functions of its own (the ring writers): those stay out of
    /// line wherever the body goes.
    pub fn calls_out(&self) -> bool {
        self.lines.iter().any(|l| l.starts_with("call"))
    }

    /// Statements one instance adds.
    pub fn statements(&self) -> usize {
        self.lines.len()
    }

    /// Whether the body reads `%smid` (to find its SM's copy of a map or ring), which its
    /// instances read from [`SM_REGISTER`]: ptxas reads the special register again at
    /// each read, and then redoes the arithmetic on it, which at an access probe's every
    /// atomic was most of the work of finding the address. A block stays on the SM it
    /// started on (only compute preemption moves one), and the copy a thread adds to is
    /// any SM's as far as the sum goes.
    pub fn reads_sm(&self) -> bool {
        self.reads_sm
    }

    /// The body as a block at one site: `site` makes its names unique in the module,
    /// `guard` (`@%p` or `@!%p`) is the call's predicate, and the site's arguments are
    /// in `%__bta0`..
    pub fn instantiate(&self, site: usize, guard: Option<&str>) -> String {
        let tag = format!("__bti{site}_");
        let end = format!("$__bti{site}_end");
        let mut out = String::from("{\n");
        if let Some(g) = guard {
            let negated = match g.strip_prefix("@!") {
                Some(p) => format!("@{p}"),
                None => format!("@!{}", g.trim_start_matches('@')),
            };
            out.push_str(&format!("{negated} bra {end};\n"));
        }
        let param = format!("{}_param_", self.symbol);
        for line in &self.lines {
            let line = self.rename(line, &tag);
            if line.starts_with("st.param.b64") && line.contains("func_retval0") {
                continue;
            }
            if let Some(code) = param_load(&line, &param) {
                out.push_str(&code);
                continue;
            }
            out.push_str(&ret_to_branch(&line, &end));
            out.push('\n');
        }
        out.push_str(&format!("{end}:\n}}\n"));
        out
    }

    /// `line` with the body's registers, labels and local arrays renamed for `tag`, and
    /// `%smid` read from [`SM_REGISTER`].
    fn rename(&self, line: &str, tag: &str) -> String {
        let mut out = String::with_capacity(line.len() + 16);
        let bytes = line.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let c = bytes[i];
            let word_start =
                matches!(c, b'%' | b'$') || (c == b'_' && line[i..].starts_with("__local_depot"));
            if !word_start || (i > 0 && is_name_byte(bytes[i - 1])) {
                out.push(c as char);
                i += 1;
                continue;
            }
            let mut j = i + 1;
            while j < bytes.len() && is_name_byte(bytes[j]) {
                j += 1;
            }
            let word = &line[i..j];
            let renamed = match c {
                b'%' => {
                    let prefix = word.trim_end_matches(|c: char| c.is_ascii_digit());
                    if word == "%smid" {
                        SM_REGISTER.to_string()
                    } else if self.registers.iter().any(|r| r == word || r == prefix) {
                        format!("%{tag}{}", &word[1..])
                    } else {
                        word.to_string()
                    }
                }
                b'$' => format!("${tag}{}", &word[1..]),
                _ => format!("{tag}{word}"),
            };
            out.push_str(&renamed);
            i = j;
        }
        out
    }
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'$')
}

/// `ld.param.T dst, [SYMBOL_param_I(+OFF)];` as a read of argument register I.
fn param_load(line: &str, param: &str) -> Option<String> {
    if !line.starts_with("ld.param.") || !line.contains(param) {
        return None;
    }
    let (opcode, rest) = line.split_once(char::is_whitespace)?;
    let ty = opcode.rsplit('.').next()?;
    let (dst, addr) = rest.trim().trim_end_matches(';').split_once(',')?;
    let addr = addr.trim().strip_prefix('[')?.strip_suffix(']')?;
    let after = addr.strip_prefix(param)?;
    let (index, offset) = match after.split_once('+') {
        Some((i, o)) => (i.parse::<usize>().ok()?, o.trim().parse::<u32>().ok()?),
        None => (after.parse::<usize>().ok()?, 0),
    };
    let bits: u32 = ty[1..].parse().ok()?;
    let dst = dst.trim();
    let arg = format!("%__bta{index}");
    if bits == 64 && offset == 0 {
        return Some(format!("mov.b64 {dst}, {arg};\n"));
    }
    if offset * 8 + bits > 64 || !matches!(bits, 8 | 16 | 32) {
        return None;
    }
    // A narrower read at a byte offset: that slice of the 64-bit argument.
    let to = if bits == 8 { 16 } else { bits };
    let cvt = if ty.starts_with('s') {
        format!("cvt.s{to}.s{bits}")
    } else {
        format!("cvt.u{to}.u{bits}")
    };
    // (cvt.uN.u64 keeps the low N bits; an 8-bit read lands in a 16-bit register,
    // extended as ld.param.u8 or .s8 extends it.)
    let narrow = if bits == 8 {
        format!("cvt.u16.u64 %__btn, %__btw;\n{cvt} {dst}, %__btn;\n")
    } else {
        format!("cvt.u{bits}.u64 {dst}, %__btw;\n")
    };
    Some(format!(
        "{{\n.reg .b64 %__btw;\n.reg .b16 %__btn;\nshr.u64 %__btw, {arg}, {};\n{narrow}}}\n",
        offset * 8
    ))
}

/// `ret;` (or `@%p ret;`, `ret.uni;`) as a branch to `end`.
fn ret_to_branch(line: &str, end: &str) -> String {
    let (guard, stmt) = match line.strip_prefix('@') {
        Some(rest) => match rest.split_once(char::is_whitespace) {
            Some((g, s)) => (Some(format!("@{g} ")), s.trim()),
            None => (None, line),
        },
        None => (None, line),
    };
    if matches!(stmt, "ret;" | "ret.uni;") {
        return format!("{}bra {end};", guard.unwrap_or_default());
    }
    line.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROBE: &str = ".visible .func  (.param .b64 func_retval0) __bpftime_probe_3(
	.param .b64 __bpftime_probe_3_param_0,
	.param .b64 __bpftime_probe_3_param_1
)
{
	.local .align 8 .b8 	__local_depot0[16];
	.reg .b64 	%SP;
	.reg .pred 	%p<2>;
	.reg .b32 	%r<3>;
	.reg .b64 	%rd<4>;
	mov.u64 	%SP, __local_depot0;
	ld.param.u64 	%rd1, [__bpftime_probe_3_param_0];
	ld.param.u32 	%r1, [__bpftime_probe_3_param_1+4];
	setp.gt.u32 	%p1, %r1, 4;
	@%p1 bra 	$L__BB0_2;
	mov.u32 	%r2, %smid;
	ret;
$L__BB0_2:
	mov.u64 	%rd3, 0;
	st.param.b64 	[func_retval0+0], %rd3;
	ret;
}
";

    #[test]
    fn a_body_becomes_a_block_of_its_own_names() {
        let body = InlineBody::find(PROBE, "__bpftime_probe_3").expect("inlinable");
        assert_eq!(body.registers, ["%SP", "%p", "%r", "%rd"]);
        let out = body.instantiate(7, Some("@!%p9"));
        // Under the call's predicate: skipped where it is false.
        assert!(out.starts_with("{\n@%p9 bra $__bti7_end;\n"), "{out}");
        // Registers, labels and the local array renamed; special registers kept.
        assert!(out.contains(".reg .b64 \t%__bti7_rd<4>;"), "{out}");
        assert!(
            out.contains("mov.u64 \t%__bti7_SP, __bti7___local_depot0;"),
            "{out}"
        );
        assert!(out.contains("@%__bti7_p1 bra \t$__bti7_L__BB0_2;"), "{out}");
        assert!(out.contains("$__bti7_L__BB0_2:"), "{out}");
        // The SM's id from the register the kernel reads it into once.
        assert!(body.reads_sm());
        assert!(
            out.contains(&format!("mov.u32 \t%__bti7_r2, {SM_REGISTER};")),
            "{out}"
        );
        // Parameters from the site's registers, a high half by a shift.
        assert!(out.contains("mov.b64 %__bti7_rd1, %__bta0;"), "{out}");
        assert!(out.contains("shr.u64 %__btw, %__bta1, 32;\ncvt.u32.u64 %__bti7_r1, %__btw;"));
        // Returns end the block; the return value is dropped.
        assert_eq!(out.matches("bra $__bti7_end;").count(), 3, "{out}");
        assert!(
            !out.contains("func_retval0") && !out.contains("ret;"),
            "{out}"
        );
        assert!(out.ends_with("$__bti7_end:\n}\n"), "{out}");
    }

    #[test]
    fn bodies_it_cannot_rewrite_keep_their_calls() {
        assert!(InlineBody::find(PROBE, "__bpftime_probe_4").is_none());
        let odd = PROBE.replace(
            "ld.param.u64 \t%rd1, [__bpftime_probe_3_param_0];",
            "mov.u64 \t%rd1, __bpftime_probe_3_param_0;",
        );
        assert!(InlineBody::find(&odd, "__bpftime_probe_3").is_none());
        let long = PROBE.replace(
            "\tret;\n}",
            &format!(
                "{}\tret;\n}}",
                "\tmov.u32 \t%r2, 0;\n".repeat(MAX_INLINE_STATEMENTS)
            ),
        );
        assert!(InlineBody::find(&long, "__bpftime_probe_3").is_none());
    }
}
