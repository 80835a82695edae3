//! `bpf_snprintf`'s formatting: the format is parsed by the rules the verifier checks
//! at load ([`bpftime_isa::bprintf`], the kernel's), and rendered here.

use bpftime_isa::bprintf::{parse, Conv, Piece, Spec};

pub use bpftime_isa::bprintf::{FormatError, MAX_ARGS};

/// Pads `body` (after `sign`) to the width.
fn pad(spec: &Spec, out: &mut Vec<u8>, sign: &[u8], body: &[u8], numeric: bool) {
    let len = sign.len() + body.len();
    let fill = spec.width.saturating_sub(len);
    if spec.left {
        out.extend_from_slice(sign);
        out.extend_from_slice(body);
        out.extend(std::iter::repeat_n(b' ', fill));
    } else if spec.zero && numeric {
        out.extend_from_slice(sign);
        out.extend(std::iter::repeat_n(b'0', fill));
        out.extend_from_slice(body);
    } else {
        out.extend(std::iter::repeat_n(b' ', fill));
        out.extend_from_slice(sign);
        out.extend_from_slice(body);
    }
}

/// An IP address as `%pI4` (`1.2.3.4`), `%pi4` (`001.002.003.004`), `%pI6` (eight
/// groups of four hex digits, colon-separated) or `%pi6` (32 hex digits) print it.
fn ip_text(bytes: &[u8], v6: bool, padded: bool) -> String {
    let parts: Vec<String> = match (v6, padded) {
        (false, false) => bytes.iter().map(|b| b.to_string()).collect(),
        (false, true) => bytes.iter().map(|b| format!("{b:03}")).collect(),
        (true, _) => bytes
            .chunks(2)
            .map(|w| format!("{:02x}{:02x}", w[0], w[1]))
            .collect(),
    };
    let sep = match (v6, padded) {
        (false, _) => ".",
        (true, false) => ":",
        (true, true) => "",
    };
    parts.join(sep)
}

/// Formats `fmt` (up to its NUL) with `args`, reading the strings of `%s` through
/// `read_str` (which returns the bytes before the NUL, or nothing for a bad address) and
/// the addresses of `%pI4`/`%pI6` through `read` (false for a bad address, which prints
/// as zeros, as in the kernel). Returns the whole text, however long; the caller
/// truncates it.
///
/// Every format the kernel accepts is rendered: `%d %i %u %x %X` with `l` or `ll`, `%c`,
/// `%s %pks %pus`, `%p %pK %px`, `%ps %pS %pB`, `%pi4 %pI4 %pi6 %pI6` and `%%`, each with
/// the flags `0 + - space` and a width. Pointers print as `%px` does, 16 hex digits:
/// there is no kernel address to hide in user space, so the kernel's hashing of `%p` and
/// `%pK` is not imitated; a code address prints as `0x` and hex, as the kernel prints
/// one it has no symbol for. printk's own suffixes after these (`%pI6c`, `%pSR`) are
/// printed as text.
pub fn format(
    fmt: &[u8],
    args: &[u64],
    read_str: &dyn Fn(u64) -> Vec<u8>,
    read: &dyn Fn(u64, &mut [u8]) -> bool,
) -> Result<Vec<u8>, FormatError> {
    let mut out = Vec::new();
    for piece in parse(fmt, args.len())? {
        let (conv, spec, v) = match piece {
            Piece::Text(t) => {
                out.extend_from_slice(t);
                continue;
            }
            Piece::Conv { conv, spec, arg } => (conv, spec, args[arg]),
        };
        match conv {
            Conv::Signed { wide } => {
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
                pad(
                    &spec,
                    &mut out,
                    sign,
                    s.unsigned_abs().to_string().as_bytes(),
                    true,
                );
            }
            Conv::Unsigned { wide } | Conv::Hex { wide, .. } => {
                let u = if wide { v } else { u64::from(v as u32) };
                let body = match conv {
                    Conv::Hex { upper: false, .. } => format!("{u:x}"),
                    Conv::Hex { upper: true, .. } => format!("{u:X}"),
                    _ => u.to_string(),
                };
                pad(&spec, &mut out, b"", body.as_bytes(), true);
            }
            Conv::Char => pad(&spec, &mut out, b"", &[v as u8], false),
            Conv::Str => pad(&spec, &mut out, b"", &read_str(v), false),
            Conv::Pointer if spec.width == 0 => {
                out.extend_from_slice(format!("{v:016x}").as_bytes());
            }
            Conv::Pointer => pad(&spec, &mut out, b"", format!("{v:x}").as_bytes(), true),
            Conv::Symbol => pad(&spec, &mut out, b"", format!("0x{v:x}").as_bytes(), false),
            Conv::Ip { v6, padded } => {
                let mut bytes = [0u8; 16];
                let bytes = &mut bytes[..if v6 { 16 } else { 4 }];
                if !read(v, bytes) {
                    bytes.fill(0);
                }
                pad(
                    &spec,
                    &mut out,
                    b"",
                    ip_text(bytes, v6, padded).as_bytes(),
                    false,
                );
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Address 1 holds "hi", address 2 the bytes 1, 2, ... 16; nothing else is readable.
    fn f(fmt: &str, args: &[u64]) -> Result<String, FormatError> {
        let read_str = |p: u64| if p == 1 { b"hi".to_vec() } else { Vec::new() };
        let read = |p: u64, out: &mut [u8]| {
            for (i, b) in out.iter_mut().enumerate() {
                *b = i as u8 + 1;
            }
            p == 2
        };
        format(fmt.as_bytes(), args, &read_str, &read).map(|v| String::from_utf8(v).unwrap())
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
    fn the_kernels_pointer_extensions_render() {
        assert_eq!(f("<%pks|%-3pus>", &[1, 1]).unwrap(), "<hi|hi >");
        assert_eq!(
            f("%ps %pS %pB", &[0x1234, 0, 0xff]).unwrap(),
            "0x1234 0x0 0xff"
        );
        assert_eq!(
            f("%pI4 %pi4 %pI4", &[2, 2, 3]).unwrap(),
            "1.2.3.4 001.002.003.004 0.0.0.0"
        );
        assert_eq!(
            f("%pI6", &[2]).unwrap(),
            "0102:0304:0506:0708:090a:0b0c:0d0e:0f10"
        );
        assert_eq!(f("%pi6", &[2]).unwrap(), "0102030405060708090a0b0c0d0e0f10");
        assert_eq!(f("%pKz", &[16]).unwrap(), "0000000000000010z");
    }

    #[test]
    fn formats_the_kernel_refuses_are_refused() {
        assert_eq!(f("%d %d", &[1]), Err(FormatError::TooFewArgs(3)));
        assert_eq!(f("%q", &[1]), Err(FormatError::BadConversion(1)));
        assert_eq!(f("%.2d", &[1]), Err(FormatError::BadConversion(1)));
        assert_eq!(f("%pz", &[1]), Err(FormatError::BadConversion(2)));
        assert_eq!(f("%sx", &[1]), Err(FormatError::BadConversion(2)));
        assert_eq!(f("%hd", &[1]), Err(FormatError::BadConversion(1)));
        assert_eq!(f("tail %", &[1]), Err(FormatError::BadConversion(6)));
        assert_eq!(f("bell\x07", &[]), Err(FormatError::BadByte(4)));
        // Fewer conversions than arguments is fine.
        assert_eq!(f("none", &[1, 2]).unwrap(), "none");
    }
}
