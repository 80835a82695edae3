//! `bpf_snprintf`'s format language as the kernel defines it: which formats it accepts
//! and which argument each conversion takes.
//!
//! The kernel checks a constant format when the program loads and again on every call;
//! bpftime does the same with this one parser: the verifier refuses at load what
//! [`parse`] refuses, and the runtime renders the [`Piece`]s it returns. The rules were
//! taken from what a 6.18 kernel accepts and refuses (`verifier/tests/const_str.rs` holds
//! ours to it, format by format).

/// Most arguments `bpf_snprintf` formats in one call (the kernel's
/// `MAX_BPRINTF_VARARGS`); more is `-EINVAL` when the helper runs, though the load-time
/// check does not look at it.
pub const MAX_ARGS: usize = 12;

/// Why a format cannot be used: the kernel refuses such a format at load ("Invalid format
/// string") and the helper answers `-EINVAL`. Offsets count from the format's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("byte {0} is an ASCII control character")]
    BadByte(usize),
    #[error("the conversion at byte {0} has no argument")]
    TooFewArgs(usize),
    #[error("unsupported conversion at byte {0}")]
    BadConversion(usize),
}

/// Flags and width of a conversion (`%-08d`); the kernel takes no precision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Spec {
    /// `-`: pad on the right.
    pub left: bool,
    /// `0`: pad numbers with zeros.
    pub zero: bool,
    /// `+`: a sign on positive numbers too.
    pub plus: bool,
    /// ` `: a space where a positive number's sign would be.
    pub space: bool,
    pub width: usize,
}

/// What a conversion prints of its argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conv {
    /// `%d %i`, of the low 32 bits, or all 64 with `l`/`ll`.
    Signed { wide: bool },
    /// `%u`.
    Unsigned { wide: bool },
    /// `%x %X`.
    Hex { wide: bool, upper: bool },
    /// `%c`: the low byte.
    Char,
    /// `%s %pks %pus`: the string the argument points to.
    Str,
    /// `%p %pK %px`: the argument's value.
    Pointer,
    /// `%ps %pS %pB`: a code address, which the kernel names by its symbol.
    Symbol,
    /// `%pi4 %pI4 %pi6 %pI6`: the IPv4 or IPv6 address the argument points to,
    /// `padded` (`i`) with every digit of every field.
    Ip { v6: bool, padded: bool },
}

/// One part of a parsed format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece<'a> {
    /// Bytes printed as they are (`%%` is one `%`).
    Text(&'a [u8]),
    /// A conversion of argument `arg` (arguments are taken in order).
    Conv { conv: Conv, spec: Spec, arg: usize },
}

/// ASCII control bytes other than white space are refused; bytes from 0x80 up pass,
/// as they do in the kernel.
fn allowed_byte(c: u8) -> bool {
    !c.is_ascii() || c.is_ascii_graphic() || c == b' ' || (b'\t'..=b'\r').contains(&c)
}

/// What may follow `%s`, `%pks`, `%pus` and a bare `%p`, which the kernel keeps from
/// running into extensions it does not support: the end, white space or punctuation,
/// in the kernel's Latin-1 character classes (no-break space is white space; `¡` to
/// `¿`, `×` and `÷` are punctuation).
fn ends_conversion(c: u8) -> bool {
    c == 0
        || c.is_ascii_whitespace()
        || c == 0x0b
        || c.is_ascii_punctuation()
        || matches!(c, 0xa0..=0xbf | 0xd7 | 0xf7)
}

/// Parses `fmt` (up to its first NUL) for `num_args` arguments, or says why the kernel
/// would refuse it. More arguments than conversions is fine.
pub fn parse(fmt: &[u8], num_args: usize) -> Result<Vec<Piece<'_>>, FormatError> {
    let fmt = &fmt[..fmt.iter().position(|&b| b == 0).unwrap_or(fmt.len())];
    let at = |i: usize| fmt.get(i).copied().unwrap_or(0);
    let mut pieces = Vec::new();
    let mut text_from = 0;
    let mut next_arg = 0;
    let mut i = 0;
    while i < fmt.len() {
        if !allowed_byte(fmt[i]) {
            return Err(FormatError::BadByte(i));
        }
        if fmt[i] != b'%' {
            i += 1;
            continue;
        }
        if text_from < i {
            pieces.push(Piece::Text(&fmt[text_from..i]));
        }
        if at(i + 1) == b'%' {
            pieces.push(Piece::Text(&fmt[i + 1..i + 2]));
            i += 2;
            text_from = i;
            continue;
        }
        if next_arg >= num_args {
            return Err(FormatError::TooFewArgs(i));
        }
        i += 1;
        let mut spec = Spec::default();
        loop {
            match at(i) {
                b'-' => spec.left = true,
                b'0' => spec.zero = true,
                b'+' => spec.plus = true,
                b' ' => spec.space = true,
                _ => break,
            }
            i += 1;
        }
        while at(i).is_ascii_digit() {
            spec.width = spec
                .width
                .saturating_mul(10)
                .saturating_add(usize::from(at(i) - b'0'));
            i += 1;
        }
        // `i` ends on the conversion's last byte.
        let mut guarded = false;
        let conv = match at(i) {
            b'p' => match (at(i + 1), at(i + 2)) {
                (b'k' | b'u', b's') => {
                    i += 2;
                    guarded = true;
                    Conv::Str
                }
                (b'K' | b'x', _) => {
                    i += 1;
                    Conv::Pointer
                }
                (b's' | b'S' | b'B', _) => {
                    i += 1;
                    Conv::Symbol
                }
                (c @ (b'i' | b'I'), v @ (b'4' | b'6')) => {
                    i += 2;
                    Conv::Ip {
                        v6: v == b'6',
                        padded: c == b'i',
                    }
                }
                _ => {
                    guarded = true;
                    Conv::Pointer
                }
            },
            b's' => {
                guarded = true;
                Conv::Str
            }
            b'c' => Conv::Char,
            _ => {
                let mut wide = false;
                if at(i) == b'l' {
                    wide = true;
                    i += 1;
                    if at(i) == b'l' {
                        i += 1;
                    }
                }
                match at(i) {
                    b'd' | b'i' => Conv::Signed { wide },
                    b'u' => Conv::Unsigned { wide },
                    c @ (b'x' | b'X') => Conv::Hex {
                        wide,
                        upper: c == b'X',
                    },
                    _ => return Err(FormatError::BadConversion(i)),
                }
            }
        };
        if guarded && !ends_conversion(at(i + 1)) {
            return Err(FormatError::BadConversion(i + 1));
        }
        pieces.push(Piece::Conv {
            conv,
            spec,
            arg: next_arg,
        });
        next_arg += 1;
        i += 1;
        text_from = i;
    }
    if text_from < fmt.len() {
        pieces.push(Piece::Text(&fmt[text_from..]));
    }
    Ok(pieces)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn convs(fmt: &str, n: usize) -> Result<Vec<Conv>, FormatError> {
        Ok(parse(fmt.as_bytes(), n)?
            .into_iter()
            .filter_map(|p| match p {
                Piece::Conv { conv, .. } => Some(conv),
                Piece::Text(_) => None,
            })
            .collect())
    }

    #[test]
    fn text_and_conversions_come_apart_in_order() {
        let p = parse(b"a%-05d%%b%s\0ignored", 2).unwrap();
        assert_eq!(
            p,
            [
                Piece::Text(b"a"),
                Piece::Conv {
                    conv: Conv::Signed { wide: false },
                    spec: Spec {
                        left: true,
                        zero: true,
                        width: 5,
                        ..Spec::default()
                    },
                    arg: 0
                },
                Piece::Text(b"%"),
                Piece::Text(b"b"),
                Piece::Conv {
                    conv: Conv::Str,
                    spec: Spec::default(),
                    arg: 1
                },
            ]
        );
    }

    #[test]
    fn kernel_pointer_extensions_are_told_apart() {
        assert_eq!(
            convs("%pks %pus %pK %px %ps %pS %pB %pi4 %pI6 %p", 10).unwrap(),
            [
                Conv::Str,
                Conv::Str,
                Conv::Pointer,
                Conv::Pointer,
                Conv::Symbol,
                Conv::Symbol,
                Conv::Symbol,
                Conv::Ip {
                    v6: false,
                    padded: true
                },
                Conv::Ip {
                    v6: true,
                    padded: false
                },
                Conv::Pointer,
            ]
        );
        assert_eq!(
            convs("%lld %lu %lX %c", 4).unwrap(),
            [
                Conv::Signed { wide: true },
                Conv::Unsigned { wide: true },
                Conv::Hex {
                    wide: true,
                    upper: true
                },
                Conv::Char,
            ]
        );
    }

    #[test]
    fn what_may_follow_a_string_or_bare_pointer_is_limited() {
        assert_eq!(parse(b"%sx", 1), Err(FormatError::BadConversion(2)));
        assert_eq!(parse(b"%pksx", 1), Err(FormatError::BadConversion(4)));
        assert_eq!(parse(b"%pa", 1), Err(FormatError::BadConversion(2)));
        assert_eq!(parse(b"%p\xc0", 1), Err(FormatError::BadConversion(2)));
        for ok in [
            &b"%s_"[..],
            b"%s\xa1",
            b"%p\xa0",
            b"%p\xd7",
            b"%cx",
            b"%pKz",
            b"%pI4x",
        ] {
            assert!(parse(ok, 1).is_ok(), "{ok:?}");
        }
    }

    #[test]
    fn formats_the_kernel_refuses_are_refused() {
        assert_eq!(parse(b"%d %d", 1), Err(FormatError::TooFewArgs(3)));
        assert_eq!(parse(b"%y", 1), Err(FormatError::BadConversion(1)));
        assert_eq!(parse(b"%.2d", 1), Err(FormatError::BadConversion(1)));
        assert_eq!(parse(b"%5-d", 1), Err(FormatError::BadConversion(2)));
        assert_eq!(parse(b"%hd", 1), Err(FormatError::BadConversion(1)));
        assert_eq!(parse(b"%lc", 1), Err(FormatError::BadConversion(2)));
        assert_eq!(parse(b"%llld", 1), Err(FormatError::BadConversion(3)));
        assert_eq!(parse(b"%pI5", 1), Err(FormatError::BadConversion(2)));
        assert_eq!(parse(b"tail %", 1), Err(FormatError::BadConversion(6)));
        assert_eq!(parse(b"bell\x07", 0), Err(FormatError::BadByte(4)));
        assert_eq!(parse(b"del\x7f", 0), Err(FormatError::BadByte(3)));
        assert!(parse(b"\x80\xff\t\n\x0b\x0c\r", 0).is_ok());
        assert!(parse(b"none", 2).is_ok());
    }
}
