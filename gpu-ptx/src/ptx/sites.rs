use super::*;

/// One step of a kernel body, in order, as the placing of access probes sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
    /// A label, a brace, a declaration, or a statement a probe's calls are not moved
    /// past (a branch, a barrier, a store, an atomic, a call, an exit, ...).
    Barrier,
    /// Arithmetic or a load, which writes the registers named (its first operand's) and
    /// nothing else.
    Plain {
        end: usize,
        writes: Vec<String>,
        /// The registers its other operands and its guard name.
        reads: Vec<String>,
        /// A load of global (or generic) memory, whose wait is worth sharing.
        load: bool,
    },
}

/// Statements that write their first operand and have no other effect a probe call
/// could be ordered against.
pub(super) const PLAIN_OPCODES: &[&str] = &[
    "ld", "ldu", "mov", "add", "sub", "mul", "mad", "mul24", "mad24", "cvt", "cvta", "shl", "shr",
    "and", "or", "xor", "not", "cnot", "setp", "selp", "set", "slct", "fma", "min", "max", "neg",
    "abs", "div", "rem", "sad", "popc", "clz", "bfe", "bfi", "bfind", "brev", "prmt", "lop3",
    "shf", "copysign", "rcp", "sqrt", "rsqrt", "ex2", "lg2", "sin", "cos", "tanh", "testp",
    "isspacep", "dp4a", "dp2a",
];

impl Step {
    pub(super) fn of(text: &str, stmt: &[(Tok, usize, usize)]) -> Step {
        let Some(Statement {
            guard,
            opcode,
            operands,
            ..
        }) = statement(text, stmt)
        else {
            return Step::Barrier;
        };
        let pieces: Vec<&str> = opcode.split('.').collect();
        // `.cc` sets the carry flag a later `addc` reads, which calls would clobber.
        if !PLAIN_OPCODES.contains(&pieces[0]) || pieces.contains(&"cc") {
            return Step::Barrier;
        }
        let ops = split_operands(operands);
        let Some(&dest) = ops.first() else {
            return Step::Barrier;
        };
        let reads = ops[1..]
            .iter()
            .copied()
            .chain(guard.as_deref())
            .flat_map(registers_in)
            .map(str::to_string)
            .collect();
        // A load's destination is registers; `ld` into anything else is not one we know.
        if dest.contains('[') {
            return Step::Barrier;
        }
        let load = matches!(pieces[0], "ld" | "ldu")
            && !pieces.iter().any(|p| {
                ["shared", "local", "param", "const"]
                    .iter()
                    .any(|s| p.starts_with(s))
            });
        Step::Plain {
            end: stmt.last().map_or(0, |t| t.2),
            writes: registers_in(dest).into_iter().map(str::to_string).collect(),
            reads,
            load,
        }
    }
}

/// The most steps an access's calls are moved over, and the most loads.
pub(super) const DEFER_STEPS: usize = 32;
pub(super) const DEFER_LOADS: usize = 8;

/// Moves each access's calls (those that go after it) past the loads that follow it in
/// the same straight run of arithmetic and loads, up to the end of the last such load:
/// ptxas does not issue a load ahead of the probe's atomics, matches and calls, so left
/// after their own access the calls would hold back the next load (vectorAdd's load of
/// `b` waited for the probe of its load of `a`), where moved, the loads are all in flight
/// while the probes run. A call is not moved past a step that writes a register its
/// arguments are read from (the address, the value, the size, its guard), nor past
/// anything but arithmetic and loads, nor past one that reads what a load passed (or the
/// access itself) loads: that step waits for the load, and the calls are better run
/// during the wait than after it. Calls keep their accesses' order.
pub(super) fn defer_calls(accesses: &mut [AccessSite], steps: &[Step]) {
    for i in (0..accesses.len()).rev() {
        let site = &accesses[i];
        if !site.after {
            continue;
        }
        let reads = &site.reads;
        let mut call_at = site.end;
        let mut loads = 0;
        // Registers loads in the window write.
        let mut loaded: Vec<&str> = match &steps[site.step] {
            Step::Plain { writes, .. } => writes.iter().map(String::as_str).collect(),
            Step::Barrier => Vec::new(),
        };
        for step in steps.iter().skip(site.step + 1).take(DEFER_STEPS) {
            let Step::Plain {
                end,
                writes,
                reads: step_reads,
                load,
            } = step
            else {
                break;
            };
            if writes.iter().any(|w| reads.contains(w))
                || step_reads.iter().any(|r| loaded.contains(&r.as_str()))
            {
                break;
            }
            if *load {
                loaded.extend(writes.iter().map(String::as_str));
                call_at = *end;
                loads += 1;
                if loads == DEFER_LOADS {
                    break;
                }
            }
        }
        // Never past a later access whose calls go before it or come earlier: the calls
        // stay in their accesses' order.
        for next in &accesses[i + 1..] {
            if next.start >= call_at {
                break;
            }
            let next_at = if next.after { next.call_at } else { next.start };
            call_at = call_at.min(next_at.max(site.end));
        }
        accesses[i].call_at = call_at;
    }
}

/// `ret`, `ret.uni` or `exit`, with an optional guard, as one statement's tokens (ending
/// with its `;`).
pub(super) fn exit_site(text: &str, stmt: &[(Tok, usize, usize)]) -> Option<ExitSite> {
    let word = |t: &(Tok, usize, usize)| (t.0 == Tok::Word).then(|| &text[t.1..t.2]);
    let (guard, rest) = match stmt {
        [(Tok::Punct(b'@'), a, _), (Tok::Punct(b'!'), _, _), reg, rest @ ..] => {
            (Some((*a, reg.2)), rest)
        }
        [(Tok::Punct(b'@'), a, _), reg, rest @ ..] => (Some((*a, reg.2)), rest),
        _ => (None, stmt),
    };
    let [op, (Tok::Punct(b';'), _, end)] = rest else {
        return None;
    };
    let opcode = word(op)?;
    if !matches!(opcode, "ret" | "ret.uni" | "exit") {
        return None;
    }
    Some(ExitSite {
        start: stmt[0].1,
        end: *end,
        guard: guard.map(|(a, b)| text[a..b].split_whitespace().collect::<String>()),
        opcode: opcode.to_string(),
    })
}

/// The widths of a kernel's registers, from its `.reg` declarations (`.reg .b64 %rd<12>;`
/// declares `%rd0`..`%rd11`; `.reg .f32 %f, %g;` names them one by one).
#[derive(Debug, Default)]
pub(super) struct Registers {
    /// `%rd` of `%rd<12>`, and its width.
    ranges: Vec<(String, u32)>,
    names: Vec<(String, u32)>,
}

impl Registers {
    /// Takes a `.reg` statement; false for any other.
    pub(super) fn declare(&mut self, text: &str, stmt: &[(Tok, usize, usize)]) -> bool {
        let words: Vec<&str> = stmt
            .iter()
            .filter(|t| t.0 == Tok::Word)
            .map(|t| &text[t.1..t.2])
            .collect();
        if words.first() != Some(&".reg") {
            return false;
        }
        let bits = words
            .iter()
            .filter_map(|w| type_bits(w.strip_prefix('.')?))
            .next_back()
            .unwrap_or(if words.contains(&".pred") { 1 } else { 0 });
        let vector = words
            .iter()
            .find_map(|w| w.strip_prefix(".v")?.parse::<u32>().ok())
            .unwrap_or(1);
        let bits = bits * vector;
        for (n, t) in stmt.iter().enumerate() {
            if t.0 != Tok::Word || !text[t.1..t.2].starts_with('%') {
                continue;
            }
            let name = text[t.1..t.2].to_string();
            if matches!(stmt.get(n + 1), Some((Tok::Punct(b'<'), _, _))) {
                self.ranges.push((name, bits));
            } else {
                self.names.push((name, bits));
            }
        }
        true
    }

    /// The width in bits of register `name`, if it was declared.
    fn bits(&self, name: &str) -> Option<u32> {
        if let Some((_, b)) = self.names.iter().rev().find(|(n, _)| n == name) {
            return Some(*b);
        }
        let prefix = name.trim_end_matches(|c: char| c.is_ascii_digit());
        if prefix.len() == name.len() {
            return None;
        }
        self.ranges
            .iter()
            .rev()
            .find(|(n, _)| n == prefix)
            .map(|(_, b)| *b)
    }
}

/// The width in bits of a PTX type name without its dot (`u32`, `f16x2`, `b128`).
pub(super) fn type_bits(t: &str) -> Option<u32> {
    match t {
        "f16x2" | "bf16x2" | "tf32" => return Some(32),
        "bf16" | "e4m3x2" | "e5m2x2" => return Some(16),
        _ => {}
    }
    let class = t.chars().next()?;
    if !matches!(class, 'u' | 's' | 'b' | 'f') {
        return None;
    }
    let bits: u32 = t[1..].parse().ok()?;
    matches!(bits, 8 | 16 | 32 | 64 | 128).then_some(bits)
}

/// Splits operands at the commas outside `[..]` and `{..}`.
pub(super) fn split_operands(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut from) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '[' | '{' => depth += 1,
            ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(s[from..i].trim());
                from = i + 1;
            }
            _ => {}
        }
    }
    if !s[from..].trim().is_empty() {
        out.push(s[from..].trim());
    }
    out
}

/// One statement's parts: its guard (`@%p` or `@!%p`), and its text from the opcode to
/// before the `;`, whole and split at the first space into opcode and operands.
pub(super) struct Statement<'t> {
    guard: Option<String>,
    text: &'t str,
    opcode: &'t str,
    operands: &'t str,
}

/// The parts of one statement's tokens (ending with its `;`).
pub(super) fn statement<'t>(text: &'t str, stmt: &[(Tok, usize, usize)]) -> Option<Statement<'t>> {
    let (guard, op_at) = match stmt {
        [(Tok::Punct(b'@'), a, _), (Tok::Punct(b'!'), _, _), reg, op, ..] => (
            Some(text[*a..reg.2].split_whitespace().collect::<String>()),
            op.1,
        ),
        [(Tok::Punct(b'@'), a, _), reg, op, ..] => (Some(text[*a..reg.2].to_string()), op.1),
        [op, ..] => (None, op.1),
        [] => return None,
    };
    let end = stmt.last()?.1;
    let whole = text[op_at..end].trim();
    let (opcode, operands) = whole
        .split_once(|c: char| c.is_whitespace())
        .unwrap_or((whole, ""));
    Some(Statement {
        guard,
        text: whole,
        opcode,
        operands,
    })
}

/// Every register definition of a kernel's body (the statement's first operand), by
/// register: `(opcode, operands)`.
#[derive(Default)]
pub(super) struct Definitions {
    by_register: HashMap<String, Vec<(String, Vec<String>)>>,
}

/// What tracing a register back finds: no parameter (an offset, a constant), exactly one,
/// or something else (a pointer loaded from memory, two parameters added).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Traced {
    Nothing,
    Param(usize),
    Unknown,
}

impl Traced {
    fn join(self, other: Traced) -> Traced {
        match (self, other) {
            (Traced::Nothing, t) | (t, Traced::Nothing) => t,
            (Traced::Param(a), Traced::Param(b)) if a == b => Traced::Param(a),
            _ => Traced::Unknown,
        }
    }
}

impl Definitions {
    /// Takes one statement's tokens (a guarded definition counts: it may happen).
    pub(super) fn take(&mut self, text: &str, stmt: &[(Tok, usize, usize)]) {
        let Some(Statement {
            opcode, operands, ..
        }) = statement(text, stmt)
        else {
            return;
        };
        let ops: Vec<String> = split_operands(operands)
            .into_iter()
            .map(str::to_string)
            .collect();
        if let Some(dest) = ops.first().filter(|d| d.starts_with('%')) {
            self.by_register
                .entry(dest.clone())
                .or_default()
                .push((opcode.to_string(), ops.clone()));
        }
    }

    /// The position of the kernel parameter (of `params`) that `reg`'s value is a pointer
    /// into, when every definition of it comes from that one parameter's 64-bit value
    /// through moves, conversions to global, and additions (or subtractions) of values
    /// that come from no parameter.
    pub(super) fn base_param(&self, reg: &str, params: &[Param]) -> Option<usize> {
        let mut visiting = Vec::new();
        match self.trace(reg, params, &mut visiting) {
            Traced::Param(i) => Some(i),
            _ => None,
        }
    }

    fn trace(&self, operand: &str, params: &[Param], visiting: &mut Vec<String>) -> Traced {
        if !operand.starts_with('%') {
            // An immediate: an offset.
            return if operand.starts_with(|c: char| c.is_ascii_digit() || c == '-') {
                Traced::Nothing
            } else {
                Traced::Unknown
            };
        }
        // A loop's pointer advanced by itself: what enters the loop decides.
        if visiting.iter().any(|v| v == operand) || visiting.len() > 64 {
            return Traced::Nothing;
        }
        let Some(defs) = self.by_register.get(operand) else {
            return Traced::Unknown;
        };
        visiting.push(operand.to_string());
        let mut found = Traced::Nothing;
        for (opcode, ops) in defs {
            let pieces: Vec<&str> = opcode.split('.').collect();
            let wide = pieces.iter().any(|p| matches!(*p, "u64" | "s64" | "b64"));
            let from = |i: usize| ops.get(i).map(String::as_str).unwrap_or("");
            let traced = match pieces[0] {
                "ld" if pieces.contains(&"param") && wide => {
                    let name = from(1).trim_start_matches('[').trim_end_matches(']');
                    params
                        .iter()
                        .position(|p| p.name == name)
                        .map_or(Traced::Unknown, Traced::Param)
                }
                "mov" | "cvta" if wide => self.trace(from(1), params, visiting),
                "add" if wide => self.trace(from(1), params, visiting).join(self.trace(
                    from(2),
                    params,
                    visiting,
                )),
                "sub" if wide => match self.trace(from(2), params, visiting) {
                    Traced::Nothing => self.trace(from(1), params, visiting),
                    _ => Traced::Unknown,
                },
                "mad" if pieces.contains(&"wide") || wide => self.trace(from(3), params, visiting),
                // Offsets: products, shifts and widenings of indices.
                "mul" | "shl" | "cvt" => Traced::Nothing,
                _ => Traced::Unknown,
            };
            found = found.join(traced);
            if found == Traced::Unknown {
                break;
            }
        }
        visiting.pop();
        found
    }
}

/// A global or shared memory access (`Some(Ok)`), a memory statement probes cannot see
/// (`Some(Err((space, why)))`), or neither (`None`), from one statement's tokens. What a
/// shared-memory probe misses of it besides (an asynchronous copy's write) goes to
/// `missed_shared`.
pub(super) fn access_site(
    text: &str,
    stmt: &[(Tok, usize, usize)],
    regs: &Registers,
    missed_shared: &mut Vec<String>,
) -> Option<Result<AccessSite, (SiteSpace, String)>> {
    let Statement {
        guard,
        text: statement,
        opcode,
        operands,
    } = statement(text, stmt)?;
    let pieces: Vec<&str> = opcode.split('.').collect();
    // An asynchronous copy from global into shared memory (`cp.async.ca.shared.global`,
    // `.cg`): its read of global memory is a load (its write into shared memory is said
    // to be missed, see `async_copy_shared_side`).
    let async_copy = is_async_copy(&pieces);
    if async_copy {
        // Its write lands when the thread waits for its group, not where it is issued.
        missed_shared.push(format!(
            "`{statement}`: the shared-memory write of an asynchronous copy is not probed \
             (its global read is)"
        ));
    }
    // A bulk copy between global and shared memory (the tensor memory accelerator's
    // one-dimensional `cp.async.bulk`, and `cp.reduce.async.bulk` into global memory):
    // one access of `size` bytes of global memory by the thread that issues it.
    let bulk = bulk_copy(&pieces);
    if let Some(BulkCopy::Copy { kind }) = bulk {
        let side = match kind {
            AccessKind::Load => "write",
            _ => "read",
        };
        missed_shared.push(format!(
            "`{statement}`: the shared-memory {side} of a bulk copy is not probed (its \
             global side is)"
        ));
    }
    // A matrix load or store of 8x8 16-bit elements (`ldmatrix`, `stmatrix`, .x1, .x2 or
    // .x4 matrices): each of the warp's first 8, 16 or 32 lanes names one 16-byte row,
    // which is that lane's access. Other shapes (sm_100's 8-bit ones) are said missed.
    let matrix = matches!(pieces[0], "ldmatrix" | "stmatrix")
        .then(|| {
            let count = pieces.iter().find_map(|p| match *p {
                "x1" => Some(1),
                "x2" => Some(2),
                "x4" => Some(4),
                _ => None,
            })?;
            (pieces.contains(&"m8n8") && pieces.contains(&"b16")).then_some(8 * count)
        })
        .flatten();
    let kind = match (bulk, pieces[0]) {
        (Some(BulkCopy::Copy { kind }), _) => kind,
        (Some(BulkCopy::Prefetch), _) => return None,
        (Some(BulkCopy::Tensor), _) => {
            return Some(
                tensor_site(stmt, &pieces, operands, guard, regs)
                    .map_err(|why| (SiteSpace::Global, format!("`{statement}`: {why}"))),
            )
        }
        _ if async_copy => AccessKind::Load,
        (_, "ld" | "ldu") => AccessKind::Load,
        (_, "st") => AccessKind::Store,
        (_, "ldmatrix") if matrix.is_some() => AccessKind::Load,
        (_, "stmatrix") if matrix.is_some() => AccessKind::Store,
        (_, "atom") => AccessKind::Atomic,
        (_, "red") => AccessKind::Reduction,
        // Shared memory that other matrix loads and stores (shared memory whether named or
        // generic) and other copies read or write: not single accesses a probe's context
        // can describe, so said to be missed.
        (_, "ldmatrix" | "stmatrix") => {
            return Some(Err((
                SiteSpace::Shared,
                format!("`{statement}`: this shape of {} is not probed", pieces[0]),
            )));
        }
        (_, "cp") if pieces.iter().any(|p| p.starts_with("shared")) => {
            return Some(Err((
                SiteSpace::Shared,
                format!("`{statement}`: a {} is not probed", pieces[0]),
            )));
        }
        _ => return None,
    };
    let space = |name: &str| pieces.iter().any(|p| p.starts_with(name));
    if ["local", "param", "const", "tex"].iter().any(|s| space(s)) {
        return None;
    }
    // `.shared::cluster` may be another CTA's memory, made generic its own way.
    let shared = pieces
        .iter()
        .find(|p| p.starts_with("shared"))
        .map(|p| match *p {
            "shared::cluster" => "shared::cluster",
            _ => "shared",
        });
    let site_space = match (shared, space("global")) {
        _ if async_copy || bulk.is_some() => SiteSpace::Global,
        (Some(_), _) => SiteSpace::Shared,
        (None, true) => SiteSpace::Global,
        (None, false) => SiteSpace::Generic,
    };
    let unseen = |why: &str| Some(Err((site_space, format!("`{statement}`: {why}"))));
    let ops = split_operands(operands);
    // Bytes accessed, and the bits of each lane of a value written.
    let mut size_reg = None;
    let (size, bits) = if matrix.is_some() {
        // A row; a lane's registers hold its share of the matrices, not its row's bytes,
        // so a store passes no value.
        (16, 0)
    } else if bulk.is_some() {
        // `size` bytes, a number or a 32-bit register read when the probe runs.
        match ops.get(2).map(|o| o.trim()) {
            Some(o) if o.starts_with('%') && regs.bits(o) == Some(32) => {
                size_reg = Some(o.to_string());
                (0, 0)
            }
            Some(o) => match parse_int(o).filter(|n| (1..=u32::MAX as i64).contains(n)) {
                Some(n) => (n as u32, 0),
                None => return unseen("no copy size"),
            },
            None => return unseen("no copy size"),
        }
    } else if async_copy {
        // `cp-size` bytes, or the `src-size` it reads where that is a number (the rest is
        // filled with zeros, not read).
        let Some(copied) = ops.get(2).and_then(|o| parse_int(o)).filter(|n| *n > 0) else {
            return unseen("no copy size");
        };
        let read = ops.get(3).and_then(|o| parse_int(o)).unwrap_or(copied);
        (read.clamp(0, copied) as u32, 0)
    } else {
        let bits = pieces
            .iter()
            .filter_map(|p| type_bits(p))
            .next_back()
            .unwrap_or(0);
        if bits == 0 {
            return unseen("no operand type");
        }
        let lanes = pieces
            .iter()
            .find_map(|p| p.strip_prefix('v')?.parse::<u32>().ok())
            .unwrap_or(1);
        ((bits * lanes).div_ceil(8), bits)
    };
    let (address, value) = match kind {
        _ if async_copy => (ops.get(1), None),
        // Global memory is the source of a copy into shared memory, else the destination.
        AccessKind::Load if bulk.is_some() => (ops.get(1), None),
        _ if bulk.is_some() => (ops.first(), None),
        AccessKind::Store if matrix.is_some() => (ops.first(), None),
        AccessKind::Load => (ops.get(1), None),
        AccessKind::Store | AccessKind::Reduction => (ops.first(), ops.get(1)),
        AccessKind::Atomic if pieces.contains(&"cas") => (ops.get(1), ops.get(3)),
        AccessKind::Atomic => (ops.get(1), ops.get(2)),
    };
    let Some(address) = address
        .and_then(|a| a.strip_prefix('['))
        .and_then(|a| a.strip_suffix(']'))
    else {
        return unseen("no address operand");
    };
    let mut prepare = String::new();
    let made_generic = match site_space {
        SiteSpace::Global => Some("global"),
        SiteSpace::Shared => shared,
        SiteSpace::Generic => None,
    };
    if let Err(why) = address_code(address, made_generic, regs, &mut prepare) {
        return unseen(&why);
    }
    prepare.push_str("mov.u64 %__bta7, 0;\nmov.u64 %__bta8, 0;\n");
    if let Some(value) = value {
        value_code(value, bits, regs, &mut prepare);
    }
    let base_reg = address
        .split('+')
        .next()
        .map(str::trim)
        .filter(|b| b.starts_with('%'))
        .map(str::to_string);
    let written = match kind {
        // A copy writes memory, never a register.
        _ if async_copy || bulk.is_some() => Vec::new(),
        AccessKind::Load | AccessKind::Atomic => {
            ops.first().map_or(Vec::new(), |d| registers_in(d))
        }
        AccessKind::Store | AccessKind::Reduction => Vec::new(),
    };
    let read: Vec<&str> = registers_in(address)
        .into_iter()
        .chain(value.map_or(Vec::new(), |v| registers_in(v)))
        .collect();
    // Everything the calls read of the kernel's registers: the address, the value, the
    // size, the guard.
    let reads = read
        .iter()
        .copied()
        .chain(guard.as_deref().map_or(Vec::new(), registers_in))
        .chain(size_reg.as_deref())
        .map(str::to_string)
        .collect();
    let end = stmt.last().map_or(stmt[0].2, |t| t.2);
    Some(Ok(AccessSite {
        start: stmt[0].1,
        end,
        call_at: end,
        step: 0,
        after: !written.iter().any(|w| read.contains(w)),
        guard,
        space: site_space,
        kind,
        size,
        lanes: matrix.filter(|&n| n < 32),
        size_reg,
        reads,
        prepare,
        base_reg,
        base_arg: None,
        tensor: None,
    }))
}

/// A tensor copy's site: a load of global memory into shared memory
/// (`cp.async.bulk.tensor.Nd.shared::cluster.global`), a store into global memory
/// (`cp.async.bulk.tensor.Nd.global.shared::cta`), or a reduction into it
/// (`cp.reduce.async.bulk.tensor`), in tile mode; the `im2col` modes are refused.
pub(super) fn tensor_site(
    stmt: &[(Tok, usize, usize)],
    pieces: &[&str],
    operands: &str,
    guard: Option<String>,
    regs: &Registers,
) -> Result<AccessSite, String> {
    if pieces.iter().any(|p| p.starts_with("im2col")) {
        return Err("a tensor copy in im2col mode is not probed (only tile mode is)".into());
    }
    let rank = pieces
        .iter()
        .find_map(|p| p.strip_suffix('d')?.parse::<usize>().ok())
        .filter(|r| (1..=5).contains(r))
        .ok_or("a tensor copy without its dimensions (`.1d` to `.5d`)")?;
    let copy_dst = pieces
        .iter()
        .find(|p| p.starts_with("global") || p.starts_with("shared"));
    let kind = match (pieces[1], copy_dst) {
        ("reduce", _) => AccessKind::Reduction,
        (_, Some(p)) if p.starts_with("shared") => AccessKind::Load,
        _ => AccessKind::Store,
    };
    let ops = split_operands(operands);
    let tensor = match kind {
        AccessKind::Load => ops.get(1),
        _ => ops.first(),
    }
    .and_then(|o| o.strip_prefix('[')?.strip_suffix(']'))
    .ok_or("no tensor map operand")?;
    let (map, coords) = tensor
        .split_once(',')
        .ok_or("no coordinates after the tensor map")?;
    let map = map.trim();
    let coords: Vec<String> = coords
        .trim()
        .strip_prefix('{')
        .and_then(|c| c.strip_suffix('}'))
        .ok_or("no `{..}` coordinates")?
        .split(',')
        .map(|c| c.trim().to_string())
        .collect();
    if coords.len() != rank {
        return Err(format!("{} coordinates for a {rank}d copy", coords.len()));
    }
    for c in &coords {
        let fits = match c.starts_with('%') {
            true => regs.bits(c) == Some(32),
            false => parse_int(c).is_some(),
        };
        if !fits {
            return Err(format!(
                "coordinate `{c}` is not a 32-bit register or a number"
            ));
        }
    }
    if !map.starts_with('%') {
        return Err(format!(
            "a tensor map named by a variable (`{map}`) is not probed (one whose address is in \
             a register is)"
        ));
    }
    if regs.bits(map) != Some(64) {
        return Err(format!("tensor map register {map} is not 64-bit"));
    }
    let reads = registers_in(tensor)
        .into_iter()
        .chain(guard.as_deref().map_or(Vec::new(), registers_in))
        .map(str::to_string)
        .collect();
    let end = stmt.last().map_or(stmt[0].2, |t| t.2);
    Ok(AccessSite {
        start: stmt[0].1,
        end,
        call_at: end,
        step: 0,
        after: true,
        guard,
        space: SiteSpace::Global,
        kind,
        size: 0,
        lanes: None,
        size_reg: None,
        reads,
        prepare: String::new(),
        base_reg: None,
        base_arg: None,
        tensor: Some(TensorBox {
            map: map.to_string(),
            coords,
        }),
    })
}

/// What a bulk copy statement (`cp.async.bulk`, `cp.reduce.async.bulk`) with global
/// memory at one end is to a memory-access probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BulkCopy {
    /// A one-dimensional copy: a load of global memory into shared memory, a store of
    /// shared memory into global memory, or a reduction into global memory.
    Copy { kind: AccessKind },
    /// A copy of a tensor map's box, whose addresses the statement does not give.
    Tensor,
    /// A prefetch into the L2 cache, which reads nothing into the SM.
    Prefetch,
}

pub(super) fn bulk_copy(pieces: &[&str]) -> Option<BulkCopy> {
    let copy = match pieces {
        ["cp", "async", "bulk", rest @ ..] => rest,
        ["cp", "reduce", "async", "bulk", rest @ ..] => rest,
        _ => return None,
    };
    if !copy.iter().any(|p| p.starts_with("global")) {
        return None;
    }
    if copy.contains(&"prefetch") {
        return Some(BulkCopy::Prefetch);
    }
    if copy.contains(&"tensor") {
        return Some(BulkCopy::Tensor);
    }
    // The destination's state space comes first.
    let kind = match (
        pieces[1],
        copy.iter()
            .find(|p| p.starts_with("global") || p.starts_with("shared")),
    ) {
        ("reduce", _) => AccessKind::Reduction,
        (_, Some(p)) if p.starts_with("shared") => AccessKind::Load,
        _ => AccessKind::Store,
    };
    Some(BulkCopy::Copy { kind })
}

/// Whether an opcode's pieces are those of an asynchronous copy from global into shared
/// memory, one thread's (`cp.async.ca.shared.global`, `cp.async.cg.shared::cta.global`),
/// not a bulk one.
pub(super) fn is_async_copy(pieces: &[&str]) -> bool {
    pieces.len() > 2
        && pieces[0] == "cp"
        && pieces[1] == "async"
        && !pieces.contains(&"bulk")
        && pieces.iter().any(|p| p.starts_with("global"))
        && pieces.iter().any(|p| p.starts_with("shared"))
}

/// The registers (`%name`) an operand names: a register, a `{..}` vector of them, an
/// address `reg+offset`.
pub(super) fn registers_in(operand: &str) -> Vec<&str> {
    operand
        .split(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '%' | '_' | '$')))
        .filter(|w| w.starts_with('%'))
        .collect()
}

/// PTX setting `%__bta6` to the generic address of `[address]`, an address in state
/// space `space` (`global`, `shared`, `shared::cluster`), or a generic one for `None`.
pub(super) fn address_code(
    address: &str,
    space: Option<&str>,
    regs: &Registers,
    out: &mut String,
) -> Result<(), String> {
    let (base, offset) = match address.split_once('+') {
        Some((b, o)) => (b.trim(), Some(o.trim())),
        None => (address.trim(), None),
    };
    // A global address in a register or a number is generic already (what cudaMalloc
    // returned); a shared one is an offset in the CTA's window, as a variable's is.
    let window = space.filter(|s| s.starts_with("shared"));
    if base.starts_with('%') {
        match regs.bits(base) {
            Some(64) => out.push_str(&format!("mov.b64 %__bta6, {base};\n")),
            Some(32) => out.push_str(&format!("cvt.u64.u32 %__bta6, {base};\n")),
            _ => return Err(format!("address register {base} of unknown width")),
        }
    } else if base.starts_with(|c: char| c.is_ascii_digit() || c == '-') {
        let n = parse_int(base).ok_or_else(|| format!("address `{base}`"))?;
        out.push_str(&format!("mov.u64 %__bta6, {};\n", n as u64));
    } else if let Some(space) = space {
        out.push_str(&format!("mov.u64 %__bta6, {base};\n"));
        if window.is_none() {
            out.push_str(&format!("cvta.{space}.u64 %__bta6, %__bta6;\n"));
        }
    } else {
        return Err(format!(
            "a generic access through variable `{base}`, whose state space is not checked"
        ));
    }
    if let Some(window) = window {
        out.push_str(&format!("cvta.{window}.u64 %__bta6, %__bta6;\n"));
    }
    if let Some(offset) = offset {
        let n = parse_int(offset).ok_or_else(|| format!("address offset `{offset}`"))?;
        if n != 0 {
            out.push_str(&format!("add.s64 %__bta6, %__bta6, {n};\n"));
        }
    }
    Ok(())
}

/// A PTX integer literal: decimal, `0x` hex, octal `0..` or binary `0b`, signed.
pub(super) fn parse_int(s: &str) -> Option<i64> {
    let s = s.trim().trim_end_matches('U');
    let (neg, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s),
    };
    let v = if let Some(h) = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        u64::from_str_radix(h, 16).ok()?
    } else if let Some(b) = digits
        .strip_prefix("0b")
        .or_else(|| digits.strip_prefix("0B"))
    {
        u64::from_str_radix(b, 2).ok()?
    } else if digits.len() > 1 && digits.starts_with('0') {
        u64::from_str_radix(&digits[1..], 8).ok()?
    } else {
        digits.parse::<u64>().ok()?
    };
    Some(if neg {
        (v as i64).wrapping_neg()
    } else {
        v as i64
    })
}

/// PTX putting the value `operand` (a register, an immediate or a `{..}` vector of
/// `bits`-wide lanes) into `%__bta7` (bytes 0..8) and `%__bta8` (8..16), zero-extended.
/// What cannot be read (a sink, a lane wider than its register) stays 0.
pub(super) fn value_code(operand: &str, bits: u32, regs: &Registers, out: &mut String) {
    let lanes: Vec<&str> = match operand.strip_prefix('{').and_then(|o| o.strip_suffix('}')) {
        Some(inner) => inner.split(',').map(str::trim).collect(),
        None => vec![operand.trim()],
    };
    let mask = |v: &str| -> String {
        if bits >= 64 {
            String::new()
        } else {
            format!("and.b64 {v}, {v}, {};\n", (1u64 << bits) - 1)
        }
    };
    for (i, lane) in lanes.iter().enumerate() {
        let at = i as u32 * bits;
        if at >= 128 {
            break;
        }
        let target = if at < 64 { "%__bta7" } else { "%__bta8" };
        let mut code = String::new();
        if lane.starts_with('%') {
            match regs.bits(lane) {
                Some(64) => code.push_str(&format!("mov.b64 %__btv, {lane};\n")),
                Some(32) => code.push_str(&format!(
                    "mov.b32 %__bth, {lane};\ncvt.u64.u32 %__btv, %__bth;\n"
                )),
                Some(16) => code.push_str(&format!(
                    "mov.b16 %__bts, {lane};\ncvt.u64.u16 %__btv, %__bts;\n"
                )),
                _ => continue,
            }
            code.push_str(&mask("%__btv"));
        } else {
            let v = if let Some(h) = lane.strip_prefix("0f").or_else(|| lane.strip_prefix("0F")) {
                u32::from_str_radix(h, 16).ok().map(u64::from)
            } else if let Some(h) = lane.strip_prefix("0d").or_else(|| lane.strip_prefix("0D")) {
                u64::from_str_radix(h, 16).ok()
            } else {
                parse_int(lane).map(|v| v as u64)
            };
            let Some(v) = v else { continue };
            let v = if bits >= 64 {
                v
            } else {
                v & ((1u64 << bits) - 1)
            };
            code.push_str(&format!("mov.u64 %__btv, {v};\n"));
        }
        if !at.is_multiple_of(64) {
            code.push_str(&format!("shl.b64 %__btv, %__btv, {};\n", at % 64));
        }
        code.push_str(&format!("or.b64 {target}, {target}, %__btv;\n"));
        out.push_str(&code);
    }
}
