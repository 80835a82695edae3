use super::sites::{access_site, defer_calls, exit_site, Definitions, Registers, Step};
use super::*;

/// A lexical token of PTX with its byte span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tok {
    /// Identifiers, directives, opcodes with their modifiers, numbers, registers.
    Word,
    Punct(u8),
    Str,
}

pub(super) struct Lexer<'a> {
    s: &'a [u8],
    i: usize,
}

pub(super) fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'$' | b'%' | b'.')
}

impl Iterator for Lexer<'_> {
    type Item = Result<(Tok, usize, usize), PtxError>;

    fn next(&mut self) -> Option<Self::Item> {
        let s = self.s;
        loop {
            while self.i < s.len() && s[self.i].is_ascii_whitespace() {
                self.i += 1;
            }
            if self.i >= s.len() {
                return None;
            }
            if s[self.i..].starts_with(b"//") {
                while self.i < s.len() && s[self.i] != b'\n' {
                    self.i += 1;
                }
                continue;
            }
            if s[self.i..].starts_with(b"/*") {
                match find(s, self.i + 2, b"*/") {
                    Some(end) => self.i = end + 2,
                    None => return Some(Err(PtxError::Unterminated("a comment"))),
                }
                continue;
            }
            break;
        }
        let start = self.i;
        let b = s[start];
        if b == b'"' {
            let mut j = start + 1;
            while j < s.len() && s[j] != b'"' {
                j += if s[j] == b'\\' { 2 } else { 1 };
            }
            if j >= s.len() {
                return Some(Err(PtxError::Unterminated("a string")));
            }
            self.i = j + 1;
            return Some(Ok((Tok::Str, start, self.i)));
        }
        if is_word_byte(b) {
            let mut j = start;
            while j < s.len() && is_word_byte(s[j]) {
                j += 1;
            }
            self.i = j;
            return Some(Ok((Tok::Word, start, j)));
        }
        self.i += 1;
        Some(Ok((Tok::Punct(b), start, start + 1)))
    }
}

pub(super) fn find(s: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    s[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

pub(super) fn tokens(text: &str) -> Result<Vec<(Tok, usize, usize)>, PtxError> {
    Lexer {
        s: text.as_bytes(),
        i: 0,
    }
    .collect()
}

/// The names of the kernels (`.entry`) a PTX module defines (a declaration, which ends at
/// a `;` before any body, is another module's kernel), without parsing their bodies: what
/// a search through many modules for one kernel needs.
pub fn entry_names(text: &str) -> Result<Vec<String>, PtxError> {
    let toks = tokens(text)?;
    let word = |i: usize| match toks.get(i) {
        Some(&(Tok::Word, a, b)) => Some(&text[a..b]),
        _ => None,
    };
    let defined = |i: usize| {
        toks[i..]
            .iter()
            .find(|t| matches!(t.0, Tok::Punct(b'{') | Tok::Punct(b';')))
            .is_some_and(|t| t.0 == Tok::Punct(b'{'))
    };
    Ok((0..toks.len())
        .filter(|&i| word(i) == Some(".entry") && defined(i))
        .filter_map(|i| word(i + 1).map(str::to_string))
        .collect())
}
/// The variables declared at the top level (after the header, which ends at
/// `header_end`) in `.global` or `.const` space, not `.extern` (those are another
/// module's), with whether a function body names them.
pub(super) fn module_variables(
    text: &str,
    toks: &[(Tok, usize, usize)],
    header_end: usize,
) -> Vec<ModuleVariable> {
    let mut found: Vec<ModuleVariable> = Vec::new();
    let mut depth = 0usize;
    // The top-level statement so far: its words, and whether it was cut by an initializer
    // (`= {...}`), after which words are values.
    let mut words: Vec<&str> = Vec::new();
    let mut initializer = false;
    // Every word written in a function body: a variable a body names is among them.
    let mut body_words: std::collections::HashSet<&str> = std::collections::HashSet::new();
    let end_statement = |words: &mut Vec<&str>, found: &mut Vec<ModuleVariable>| {
        let space = |w: &str| words.contains(&w);
        if !space(".func") && !space(".entry") && !space(".extern") {
            let constant = space(".const");
            if constant || space(".global") {
                let name = words
                    .iter()
                    .find(|w| !w.starts_with('.') && !w.starts_with(|c: char| c.is_ascii_digit()));
                if let Some(name) = name {
                    found.push(ModuleVariable {
                        name: name.to_string(),
                        constant,
                        used: false,
                    });
                }
            }
        }
        words.clear();
    };
    let mut in_function = false;
    for &(tok, a, b) in toks.iter().filter(|t| t.1 >= header_end) {
        match tok {
            Tok::Punct(b'{') => {
                if depth == 0 && !initializer {
                    in_function = true;
                }
                depth += 1;
            }
            Tok::Punct(b'}') => {
                depth = depth.saturating_sub(1);
                if depth == 0 && in_function {
                    in_function = false;
                    words.clear();
                }
            }
            Tok::Punct(b'=') if depth == 0 => initializer = true,
            Tok::Punct(b';') if depth == 0 => {
                end_statement(&mut words, &mut found);
                initializer = false;
            }
            Tok::Word if depth == 0 && !initializer => words.push(&text[a..b]),
            Tok::Word if in_function => {
                body_words.insert(&text[a..b]);
            }
            _ => {}
        }
    }
    for v in &mut found {
        v.used = body_words.contains(v.name.as_str());
    }
    found
}

pub(super) fn line_end(text: &str, from: usize) -> usize {
    text[from..].find('\n').map_or(text.len(), |n| from + n)
}

/// The first byte after the header where a top-level declaration begins (a line that is
/// not blank, a comment, or a header directive); `header_end` when there is none.
pub(super) fn first_definition(text: &str, header_end: usize) -> usize {
    let mut at = header_end;
    for line in text[header_end..].split_inclusive('\n') {
        let t = line.trim();
        if !(t.is_empty() || t.starts_with("//")) {
            return at;
        }
        at += line.len();
    }
    header_end
}

pub(super) fn parse_version(v: &str) -> Result<Version, PtxError> {
    let (major, minor) = v.split_once('.').ok_or(PtxError::NoVersion)?;
    Ok(Version::new(
        major.parse().map_err(|_| PtxError::NoVersion)?,
        minor.parse().map_err(|_| PtxError::NoVersion)?,
    ))
}

/// Parses the `.entry` at token `k`; returns the kernel (none for a declaration without
/// a body) and the token index after it.
pub(super) fn parse_kernel(
    text: &str,
    toks: &[(Tok, usize, usize)],
    k: usize,
    start: usize,
) -> Result<(Option<Kernel>, usize), PtxError> {
    let w = |i: usize| match toks.get(i) {
        Some(&(Tok::Word, a, b)) => Some(&text[a..b]),
        _ => None,
    };
    let name = w(k + 1)
        .ok_or(PtxError::Unterminated("a kernel's name"))?
        .to_string();
    let mut i = k + 2;
    let mut params = Vec::new();
    if matches!(toks.get(i), Some((Tok::Punct(b'('), _, _))) {
        let close = (i..toks.len())
            .find(|&j| matches!(toks[j].0, Tok::Punct(b')')))
            .ok_or(PtxError::Unterminated("a kernel's parameter list"))?;
        for decl in toks[i + 1..close].split(|t| matches!(t.0, Tok::Punct(b','))) {
            if decl.is_empty() {
                continue;
            }
            params.push(
                parse_param(text, decl).map_err(|reason| PtxError::BadParams {
                    kernel: name.clone(),
                    reason,
                })?,
            );
        }
        i = close + 1;
    }
    // Performance directives, then the body or a `;`.
    let mut maxnreg = None;
    while i < toks.len() && !matches!(toks[i].0, Tok::Punct(b'{') | Tok::Punct(b';')) {
        if w(i) == Some(".maxnreg") {
            maxnreg = w(i + 1).and_then(|n| n.parse().ok());
        }
        i += 1;
    }
    match toks.get(i) {
        Some(&(Tok::Punct(b';'), _, _)) => return Ok((None, i + 1)),
        None => return Err(PtxError::Unterminated("a kernel")),
        _ => {}
    }
    let body_open = toks[i].1;
    let mut depth = 0usize;
    let mut exits = Vec::new();
    let mut accesses = Vec::new();
    let mut unseen_accesses = Vec::new();
    let mut unseen_shared_accesses = Vec::new();
    let mut regs = Registers::default();
    let mut defs = Definitions::default();
    let mut vector = 0usize;
    let mut steps: Vec<Step> = Vec::new();
    // The current statement's first token (after any labels).
    let mut stmt: Option<usize> = None;
    let mut j = i;
    let body_close = loop {
        let Some(&(tok, a, _)) = toks.get(j) else {
            return Err(PtxError::Unterminated("a kernel's body"));
        };
        match tok {
            // Inside a statement, braces hold a vector operand: `{%f1, %f2}`.
            Tok::Punct(b'{') if stmt.is_some() => vector += 1,
            Tok::Punct(b'}') if vector > 0 => vector -= 1,
            Tok::Punct(b'{') => {
                depth += 1;
                stmt = None;
                steps.push(Step::Barrier);
            }
            Tok::Punct(b'}') => {
                depth -= 1;
                stmt = None;
                steps.push(Step::Barrier);
                if depth == 0 {
                    break a;
                }
            }
            Tok::Punct(b';') => {
                if let Some(s) = stmt.take() {
                    let statement = &toks[s..=j];
                    if let Some(site) = exit_site(text, statement) {
                        exits.push(site);
                        steps.push(Step::Barrier);
                    } else if regs.declare(text, statement) {
                        steps.push(Step::Barrier);
                    } else {
                        defs.take(text, statement);
                        match access_site(text, statement, &regs, &mut unseen_shared_accesses) {
                            Some(Ok(mut site)) => {
                                site.step = steps.len();
                                accesses.push(site);
                            }
                            Some(Err((SiteSpace::Shared, why))) => unseen_shared_accesses.push(why),
                            Some(Err((_, why))) => unseen_accesses.push(why),
                            None => {}
                        }
                        steps.push(Step::of(text, statement));
                    }
                }
            }
            // (Identifiers have no dots: `ld.global.L1::evict_last` is no label.)
            Tok::Punct(b':')
                if stmt
                    .is_some_and(|s| s + 1 == j && !text[toks[s].1..toks[s].2].contains('.')) =>
            {
                // `LABEL:` ends a label, not a statement.
                stmt = None;
                steps.push(Step::Barrier);
            }
            _ => {
                if stmt.is_none() {
                    stmt = Some(j);
                }
            }
        }
        j += 1;
    };
    for site in &mut accesses {
        site.base_arg = site
            .base_reg
            .as_deref()
            .and_then(|reg| defs.base_param(reg, &params));
    }
    defer_calls(&mut accesses, &steps);
    Ok((
        Some(Kernel {
            name,
            params,
            start,
            maxnreg,
            body_open,
            body_close,
            exits,
            accesses,
            unseen_accesses,
            unseen_shared_accesses,
        }),
        j + 1,
    ))
}

pub(super) fn parse_param(text: &str, decl: &[(Tok, usize, usize)]) -> Result<Param, String> {
    let words: Vec<&str> = decl
        .iter()
        .filter(|t| t.0 == Tok::Word)
        .map(|t| &text[t.1..t.2])
        .collect();
    if words.first() != Some(&".param") {
        return Err(format!("`{}` is not a `.param`", words.join(" ")));
    }
    let is_array = decl.iter().any(|t| t.0 == Tok::Punct(b'['));
    let name_index = words
        .iter()
        .rposition(|w| !w.starts_with('.') && !w.chars().all(|c| c.is_ascii_digit()))
        .ok_or("a parameter without a name")?;
    let name = words[name_index].to_string();
    let types: Vec<&str> = words[1..name_index].to_vec();
    let scalar = types.iter().rev().find_map(|t| {
        let t = t.strip_prefix('.')?;
        let class = t.chars().next()?;
        let bits: u32 = t[1..].parse().ok()?;
        matches!(class, 'u' | 's' | 'b' | 'f').then_some((class, bits))
    });
    let (class, bits) = scalar.ok_or_else(|| format!("`{name}` has no scalar type"))?;
    if is_array {
        let align = types
            .iter()
            .position(|t| *t == ".align")
            .and_then(|p| words.get(p + 2))
            .and_then(|a| a.parse().ok())
            .unwrap_or(bits / 8);
        let count: u32 = words
            .get(name_index + 1)
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("`{name}` is an array without a length"))?;
        return Ok(Param {
            name,
            ty: ParamType::Bytes {
                align,
                len: count * (bits / 8).max(1),
            },
        });
    }
    Ok(Param {
        name,
        ty: ParamType::Scalar { class, bits },
    })
}
