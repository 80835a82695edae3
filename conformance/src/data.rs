use std::path::{Path, PathBuf};
use thiserror::Error;

/// The environment variable that names the directory of `.data` files.
pub const SUITE_DIR_ENV: &str = "BPF_CONFORMANCE_DIR";

/// Where the suite is unless told otherwise: `$BPF_CONFORMANCE_DIR`, else
/// `shared/conformance/bpf_conformance` beside the workspace (where CI puts it).
pub fn default_suite_dir() -> PathBuf {
    match std::env::var_os(SUITE_DIR_ENV) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/conformance/bpf_conformance"),
    }
}

#[derive(Debug, Error)]
pub enum SuiteError {
    #[error(
        "cannot read the bpf_conformance tests at {} ({source}); set BPF_CONFORMANCE_DIR to \
         the directory holding the .data files",
        dir.display()
    )]
    Unreadable {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "no .data files in {}; set BPF_CONFORMANCE_DIR to the directory holding them",
        dir.display()
    )]
    Empty { dir: PathBuf },
}

/// The suite's `.data` files in `dir`, sorted by name.
pub fn suite_files(dir: &Path) -> Result<Vec<PathBuf>, SuiteError> {
    let unreadable = |source| SuiteError::Unreadable {
        dir: dir.to_path_buf(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let path = entry.map_err(unreadable)?.path();
        if path.extension().is_some_and(|x| x == "data") {
            files.push(path);
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(SuiteError::Empty {
            dir: dir.to_path_buf(),
        });
    }
    Ok(files)
}

/// A test's name: its file name without `.data`.
pub fn test_name(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// What a test expects of the program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expectation {
    /// `-- result`: r0 at exit.
    Value(u64),
    /// `-- error`: the program must be refused or stop with an error (the text is the uBPF
    /// message, kept for reports; engines word their errors differently).
    Error(String),
}

/// One `.data` file: a program in uBPF assembler, optional memory, what it must produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestCase {
    pub name: String,
    /// `-- asm`: the program text.
    pub asm: String,
    /// `-- mem`: bytes the program gets a pointer to in r1 (length in r2).
    pub mem: Vec<u8>,
    pub expect: Expectation,
    /// `-- raw`: the program's encoding, one little-endian slot per value, when given.
    pub raw: Option<Vec<u64>>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("{test}: no `-- asm` section")]
    NoAsm { test: String },
    #[error("{test}: neither `-- result` nor `-- error`")]
    NoExpectation { test: String },
    #[error("{test}: line {line}: `{text}` is not a hex byte")]
    BadMemByte {
        test: String,
        line: usize,
        text: String,
    },
    #[error("{test}: line {line}: `{text}` is not a number")]
    BadNumber {
        test: String,
        line: usize,
        text: String,
    },
}

/// Parses a bpf_conformance `.data` file; `name` labels errors and the test.
///
/// Sections other than asm, mem, result, error and raw (`-- c`, notes such as
/// `-- no register offset`) describe the test and are not needed to run it.
pub fn parse_test(name: &str, text: &str) -> Result<TestCase, ParseError> {
    let mut sections: Vec<(&str, Vec<(usize, &str)>)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if let Some(header) = line.strip_prefix("--") {
            sections.push((header.trim(), Vec::new()));
        } else if let Some((_, body)) = sections.last_mut() {
            body.push((i + 1, line));
        }
    }
    let section = |want: &str| {
        sections
            .iter()
            .find(|(name, _)| *name == want)
            .map(|(_, body)| body.as_slice())
    };
    let uncommented = |body: &[(usize, &str)]| -> Vec<(usize, String)> {
        body.iter()
            .map(|&(n, l)| (n, l.split('#').next().unwrap_or("").trim().to_string()))
            .filter(|(_, l)| !l.is_empty())
            .collect()
    };
    let number = |line: usize, text: &str| -> Result<u64, ParseError> {
        parse_u64(text).ok_or_else(|| ParseError::BadNumber {
            test: name.to_string(),
            line,
            text: text.to_string(),
        })
    };

    let asm = section("asm")
        .ok_or_else(|| ParseError::NoAsm {
            test: name.to_string(),
        })?
        .iter()
        .map(|(_, l)| *l)
        .collect::<Vec<_>>()
        .join("\n");

    let mut mem = Vec::new();
    for (line, text) in uncommented(section("mem").unwrap_or(&[])) {
        for tok in text.split_whitespace() {
            let byte = (tok.len() == 2)
                .then(|| u8::from_str_radix(tok, 16).ok())
                .flatten()
                .ok_or_else(|| ParseError::BadMemByte {
                    test: name.to_string(),
                    line,
                    text: tok.to_string(),
                })?;
            mem.push(byte);
        }
    }

    let raw = match section("raw") {
        Some(body) => Some(
            uncommented(body)
                .iter()
                .map(|(line, text)| number(*line, text))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        None => None,
    };

    let expect = if let Some(body) = section("result") {
        let lines = uncommented(body);
        let (line, text) = lines.first().ok_or_else(|| ParseError::NoExpectation {
            test: name.to_string(),
        })?;
        Expectation::Value(number(*line, text)?)
    } else if let Some(body) = section("error") {
        Expectation::Error(
            body.iter()
                .map(|(_, l)| l.trim())
                .collect::<Vec<_>>()
                .join(" ")
                .trim()
                .to_string(),
        )
    } else {
        return Err(ParseError::NoExpectation {
            test: name.to_string(),
        });
    };

    Ok(TestCase {
        name: name.to_string(),
        asm,
        mem,
        expect,
        raw,
    })
}

/// `0x` hex or decimal; a negative decimal is read as its two's complement.
fn parse_u64(text: &str) -> Option<u64> {
    if let Some(hex) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16).ok()
    } else if let Some(neg) = text.strip_prefix('-') {
        neg.parse::<u64>().ok().map(u64::wrapping_neg)
    } else {
        text.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_section_it_runs_on() {
        let t = parse_test(
            "t",
            "# header\n-- asm\nmov %r0, 1 # c\nexit\n-- mem\n00 ff\n0a\n-- raw\n0x00000001000000b7\n-- result\n0x1\n-- no register offset\ncall instruction\n",
        )
        .unwrap();
        assert_eq!(t.asm, "mov %r0, 1 # c\nexit");
        assert_eq!(t.mem, vec![0x00, 0xff, 0x0a]);
        assert_eq!(t.raw, Some(vec![0xb7 | (1 << 32)]));
        assert_eq!(t.expect, Expectation::Value(1));
    }

    #[test]
    fn error_expectation_and_missing_sections() {
        let t = parse_test("t", "-- asm\nexit\n-- error\nFailed to load\n").unwrap();
        assert_eq!(t.expect, Expectation::Error("Failed to load".into()));
        assert_eq!(
            parse_test("t", "-- asm\nexit\n"),
            Err(ParseError::NoExpectation { test: "t".into() })
        );
        assert_eq!(
            parse_test("t", "-- result\n0\n"),
            Err(ParseError::NoAsm { test: "t".into() })
        );
        assert!(matches!(
            parse_test("t", "-- asm\nexit\n-- mem\n0g\n-- result\n0"),
            Err(ParseError::BadMemByte { line: 4, .. })
        ));
    }
}
