//! `bpf_snprintf`'s formatting: the kernel's restricted conversion set, checked as
//! strictly as the kernel checks it, so a format the kernel refuses is refused here.

/// Most arguments `bpf_snprintf` takes (the kernel's `MAX_BPRINTF_VARARGS`).
pub const MAX_ARGS: usize = 12;

/// Why a format cannot be used; each is `-EINVAL` to the program, as in the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FormatError {
    /// A byte that is neither printable ASCII nor white space, at this offset.
    BadByte(usize),
    /// More conversions than arguments, at the conversion starting here.
    TooFewArgs(usize),
    /// A conversion outside the supported set, at this offset.
    BadConversion(usize),
}

#[derive(Clone, Copy, Default)]
struct Spec {
    left: bool,
    zero: bool,
    plus: bool,
    space: bool,
    width: usize,
}

impl Spec {
    /// Pads `body` (after `sign`) to the width.
    fn pad(&self, out: &mut Vec<u8>, sign: &[u8], body: &[u8], numeric: bool) {
        let len = sign.len() + body.len();
        let fill = self.width.saturating_sub(len);
        if self.left {
            out.extend_from_slice(sign);
            out.extend_from_slice(body);
            out.extend(std::iter::repeat_n(b' ', fill));
        } else if self.zero && numeric {
            out.extend_from_slice(sign);
            out.extend(std::iter::repeat_n(b'0', fill));
            out.extend_from_slice(body);
        } else {
            out.extend(std::iter::repeat_n(b' ', fill));
            out.extend_from_slice(sign);
            out.extend_from_slice(body);
        }
    }
}

/// Formats `fmt` (up to its NUL) with `args`, reading the strings of `%s` through
/// `read_str` (which returns the bytes before the NUL, or nothing for a bad address).
/// Returns the whole text, however long; the caller truncates it.
///
/// Supported: `%d %i %u %x %X` with `l` or `ll`, `%p %pK %px`, `%s`, `%c`, `%%`, each
/// with the flags `0 + - space` and a width, as the kernel allows. Pointers print as
/// `%px` does, 16 hex digits: there is no kernel address to hide in user space, so the
/// kernel's hashing of `%p` and `%pK` is not imitated.
pub fn format(
    fmt: &[u8],
    args: &[u64],
    read_str: &dyn Fn(u64) -> Vec<u8>,
) -> Result<Vec<u8>, FormatError> {
    let fmt = &fmt[..fmt.iter().position(|&b| b == 0).unwrap_or(fmt.len())];
    let at = |i: usize| fmt.get(i).copied().unwrap_or(0);
    let mut out = Vec::new();
    let mut next_arg = 0usize;
    let mut i = 0usize;
    while i < fmt.len() {
        let c = fmt[i];
        if !((0x20..=0x7e).contains(&c) || matches!(c, b'\t' | b'\n' | 0x0b | 0x0c | b'\r')) {
            return Err(FormatError::BadByte(i));
        }
        if c != b'%' {
            out.push(c);
            i += 1;
            continue;
        }
        if at(i + 1) == b'%' {
            out.push(b'%');
            i += 2;
            continue;
        }
        let start = i;
        let Some(&v) = args.get(next_arg) else {
            return Err(FormatError::TooFewArgs(start));
        };
        next_arg += 1;
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
            spec.width = spec.width.saturating_mul(10) + usize::from(at(i) - b'0');
            i += 1;
        }
        match at(i) {
            b'p' => {
                let mut suffix = at(i + 1);
                if suffix == b'K' || suffix == b'x' {
                    i += 1;
                    suffix = at(i + 1);
                }
                // Other extensions (%pB, %pi4, %pks, ...) are not supported.
                if suffix != 0 && !suffix.is_ascii_whitespace() && !suffix.is_ascii_punctuation() {
                    return Err(FormatError::BadConversion(i + 1));
                }
                let width = spec.width;
                if width == 0 {
                    out.extend_from_slice(format!("{v:016x}").as_bytes());
                } else {
                    spec.pad(&mut out, b"", format!("{v:x}").as_bytes(), true);
                }
                i += 1;
                continue;
            }
            b's' => {
                spec.pad(&mut out, b"", &read_str(v), false);
                i += 1;
                continue;
            }
            b'c' => {
                spec.pad(&mut out, b"", &[v as u8], false);
                i += 1;
                continue;
            }
            _ => {}
        }
        let mut wide = false;
        if at(i) == b'l' {
            wide = true;
            i += 1;
            if at(i) == b'l' {
                i += 1;
            }
        }
        let conv = at(i);
        let (sign, body): (&[u8], String) = match conv {
            b'd' | b'i' => {
                let s = if wide { v as i64 } else { i64::from(v as i32) };
                let sign: &[u8] = if s < 0 {
                    b"-"
                } else if spec.plus {
                    b"+"
                } else if spec.space {
                    b" "
                } else {
                    b""
                };
                (sign, s.unsigned_abs().to_string())
            }
            b'u' | b'x' | b'X' => {
                let u = if wide { v } else { u64::from(v as u32) };
                let body = match conv {
                    b'u' => u.to_string(),
                    b'x' => format!("{u:x}"),
                    _ => format!("{u:X}"),
                };
                (b"", body)
            }
            _ => return Err(FormatError::BadConversion(i)),
        };
        spec.pad(&mut out, sign, body.as_bytes(), true);
        i += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(fmt: &str, args: &[u64]) -> Result<String, FormatError> {
        let read = |p: u64| if p == 1 { b"hi".to_vec() } else { Vec::new() };
        format(fmt.as_bytes(), args, &read).map(|v| String::from_utf8(v).unwrap())
    }

    #[test]
    fn integers_follow_their_size_and_flags() {
        let m1 = -1i64 as u64;
        assert_eq!(
            f("%d %ld %u %lu", &[m1, m1, m1, m1]).unwrap(),
            "-1 -1 4294967295 18446744073709551615"
        );
        assert_eq!(
            f("%x %X %llx %i", &[255, 255, m1, 7]).unwrap(),
            "ff FF ffffffffffffffff 7"
        );
        assert_eq!(
            f("[%5d|%-5d|%05d|%+d|% d]", &[42, 42, 42, 42, 42]).unwrap(),
            "[   42|42   |00042|+42| 42]"
        );
        assert_eq!(f("%05d", &[(-42i64) as u64]).unwrap(), "-0042");
        assert_eq!(f("%lld %llu", &[m1, 5]).unwrap(), "-1 5");
    }

    #[test]
    fn strings_chars_pointers_and_percent() {
        assert_eq!(
            f("<%s|%4s|%-4s|%s>", &[1, 1, 1, 0]).unwrap(),
            "<hi|  hi|hi  |>"
        );
        assert_eq!(f("%c%c %%", &[b'o' as u64, b'k' as u64]).unwrap(), "ok %");
        assert_eq!(
            f("%p %px %pK", &[0x1234, 0x10, 0]).unwrap(),
            "0000000000001234 0000000000000010 0000000000000000"
        );
        assert_eq!(f("%p.", &[1]).unwrap(), "0000000000000001.");
    }

    #[test]
    fn formats_the_kernel_refuses_are_refused() {
        assert_eq!(f("%d %d", &[1]), Err(FormatError::TooFewArgs(3)));
        assert_eq!(f("%q", &[1]), Err(FormatError::BadConversion(1)));
        assert_eq!(f("%.2d", &[1]), Err(FormatError::BadConversion(1)));
        assert_eq!(f("%pB", &[1]), Err(FormatError::BadConversion(2)));
        assert_eq!(f("%hd", &[1]), Err(FormatError::BadConversion(1)));
        assert_eq!(f("tail %", &[1]), Err(FormatError::BadConversion(6)));
        assert_eq!(f("bell\x07", &[]), Err(FormatError::BadByte(4)));
        // Fewer conversions than arguments is fine.
        assert_eq!(f("none", &[1, 2]).unwrap(), "none");
    }
}
