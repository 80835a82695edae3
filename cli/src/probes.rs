//! Where the programs of an object attach, for `bpftime run`: the section
//! names libbpf understands (`uprobe//path:func`, `uprobe/path:func+0x10`,
//! `uretprobe/libc.so.6:malloc`), our short form for the app itself
//! (`uprobe/func`), or `--attach PROG=TARGET`, resolved to a file and a
//! function that exists in it before anything is loaded.

use anyhow::{anyhow, bail, Context, Result};
use goblin::elf::{sym, Elf};
use std::path::{Path, PathBuf};

/// What a section (or `--attach`) asks for, before resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetSpec {
    /// `None`: the app's own binary.
    pub file: Option<String>,
    pub func: FuncSpec,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FuncSpec {
    /// A function by name, plus an offset into it (libbpf's `func+off`).
    Symbol { name: String, offset: u64 },
    /// A raw file offset (`path:0x1234`).
    Offset(u64),
}

/// A probe ready to hand to libbpf.
#[derive(Debug, Clone)]
pub struct Attachment {
    pub prog: String,
    pub retprobe: bool,
    pub file: PathBuf,
    /// libbpf looks the symbol up itself; we only checked that it exists.
    pub func_name: Option<String>,
    pub offset: u64,
}

impl Attachment {
    pub fn describe(&self) -> String {
        let kind = if self.retprobe { "uretprobe" } else { "uprobe" };
        let at = match (&self.func_name, self.offset) {
            (Some(f), 0) => f.clone(),
            (Some(f), o) => format!("{f}+{o:#x}"),
            (None, o) => format!("{o:#x}"),
        };
        format!("{} ({kind}) -> {}:{at}", self.prog, self.file.display())
    }
}

/// Splits a section name into (is a uretprobe, what follows the first `/`).
/// `None` when the section is not a uprobe section at all.
pub fn uprobe_section(section: &str) -> Option<(bool, &str)> {
    let (kind, rest) = match section.split_once('/') {
        Some((k, r)) => (k, r),
        None => (section, ""),
    };
    match kind {
        "uprobe" | "uprobe.s" => Some((false, rest)),
        "uretprobe" | "uretprobe.s" => Some((true, rest)),
        _ => None,
    }
}

fn parse_number(s: &str) -> Option<u64> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Parses `[path:]func[+offset]` or `[path:]0xoffset`. The path ends at the
/// first `:`, as in libbpf; an empty path, or none, means the app's binary.
pub fn parse_target(spec: &str) -> Result<TargetSpec, String> {
    let (file, func) = match spec.split_once(':') {
        Some((f, func)) => ((!f.is_empty()).then(|| f.to_string()), func),
        None => (None, spec),
    };
    if func.is_empty() {
        return Err(format!(
            "`{spec}` names no function (expected [PATH:]FUNC[+OFFSET])"
        ));
    }
    if let Some(off) = parse_number(func) {
        return Ok(TargetSpec {
            file,
            func: FuncSpec::Offset(off),
        });
    }
    let (name, offset) = match func.rsplit_once('+') {
        Some((name, off)) => match parse_number(off) {
            Some(o) if !name.is_empty() => (name, o),
            _ => return Err(format!("`{func}`: bad offset after `+`")),
        },
        None => (func, 0),
    };
    Ok(TargetSpec {
        file,
        func: FuncSpec::Symbol {
            name: name.to_string(),
            offset,
        },
    })
}

/// Finds a library given by name (`libc.so.6`) the way the app would most
/// likely get it: `LD_LIBRARY_PATH`, the copy this process has loaded, the
/// system directories; an executable name is looked up on `PATH`.
pub fn find_library(name: &str) -> Option<PathBuf> {
    let from_env = std::env::var_os("LD_LIBRARY_PATH")
        .map(|v| std::env::split_paths(&v).collect::<Vec<_>>())
        .unwrap_or_default();
    if let Some(p) = from_env.iter().map(|d| d.join(name)).find(|p| p.is_file()) {
        return Some(p);
    }
    if !name.contains('/') {
        if let Ok(p) = bpftime_attach::resolve_binary(Path::new(name)) {
            return Some(p);
        }
    }
    const SYSTEM_DIRS: &[&str] = &[
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/lib/aarch64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/lib64",
        "/usr/lib64",
        "/lib",
        "/usr/lib",
        "/usr/local/lib",
    ];
    if let Some(p) = SYSTEM_DIRS
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
    {
        return Some(p);
    }
    crate::find_program(Path::new(name))
}

/// Resolves `spec` for program `prog`, checking that the file exists and holds
/// the function. `app` is the app's binary (already found on `PATH`).
pub fn resolve(prog: &str, retprobe: bool, spec: &TargetSpec, app: &Path) -> Result<Attachment> {
    let file = match &spec.file {
        None => app.to_path_buf(),
        Some(f) if f.contains('/') => {
            let p = PathBuf::from(f);
            if !p.is_file() {
                bail!("program `{prog}`: the probe's target file {f} does not exist");
            }
            p
        }
        Some(f) => find_library(f).ok_or_else(|| {
            anyhow!(
                "program `{prog}`: cannot find `{f}` (looked in LD_LIBRARY_PATH, the libraries bpftime has loaded, the system library directories and PATH); give its full path"
            )
        })?,
    };
    let file = std::fs::canonicalize(&file)
        .with_context(|| format!("program `{prog}`: cannot resolve {}", file.display()))?;
    let bytes = std::fs::read(&file)
        .with_context(|| format!("program `{prog}`: cannot read {}", file.display()))?;
    let elf = Elf::parse(&bytes).map_err(|e| {
        anyhow!(
            "program `{prog}`: {} is not an ELF binary or library ({e})",
            file.display()
        )
    })?;
    let (func_name, offset) = match &spec.func {
        FuncSpec::Offset(o) => {
            if *o >= bytes.len() as u64 {
                bail!(
                    "program `{prog}`: offset {o:#x} is past the end of {} ({} bytes)",
                    file.display(),
                    bytes.len()
                );
            }
            (None, *o)
        }
        FuncSpec::Symbol { name, offset } => {
            check_function(&elf, name)
                .map_err(|why| anyhow!("program `{prog}`: {why} in {}", file.display()))?;
            (Some(name.clone()), *offset)
        }
    };
    Ok(Attachment {
        prog: prog.to_string(),
        retprobe,
        file,
        func_name,
        offset,
    })
}

/// Whether `name` is a defined function in either symbol table (libbpf looks
/// in both, and wants a function or an indirect function).
fn check_function(elf: &Elf, name: &str) -> Result<(), String> {
    let mut seen_other = false;
    let tables = [(&elf.syms, &elf.strtab), (&elf.dynsyms, &elf.dynstrtab)];
    for (syms, strs) in tables {
        for s in syms.iter() {
            if strs.get_at(s.st_name) != Some(name)
                || s.st_shndx == goblin::elf::section_header::SHN_UNDEF as usize
            {
                continue;
            }
            if matches!(s.st_type(), sym::STT_FUNC | sym::STT_GNU_IFUNC) {
                return Ok(());
            }
            seen_other = true;
        }
    }
    if seen_other {
        Err(format!("symbol `{name}` is not a function"))
    } else if elf.syms.is_empty() && elf.dynsyms.is_empty() {
        Err(format!(
            "no symbol `{name}`: the file has no symbol table (stripped?)"
        ))
    } else {
        Err(format!(
            "no function `{name}` (not in the symbol tables: misspelled, static and inlined, or stripped?)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(name: &str, offset: u64) -> FuncSpec {
        FuncSpec::Symbol {
            name: name.into(),
            offset,
        }
    }

    #[test]
    fn section_forms() {
        assert_eq!(uprobe_section("uprobe"), Some((false, "")));
        assert_eq!(uprobe_section("uretprobe/work"), Some((true, "work")));
        assert_eq!(
            uprobe_section("uprobe//usr/bin/x:f"),
            Some((false, "/usr/bin/x:f"))
        );
        assert_eq!(
            uprobe_section("uprobe.s/libc.so.6:malloc").map(|s| s.0),
            Some(false)
        );
        assert_eq!(uprobe_section("kprobe/do_sys_open"), None);
        assert_eq!(uprobe_section("uprobes/x"), None);
    }

    #[test]
    fn target_forms() {
        let t = parse_target("/usr/bin/x:main+0x10").unwrap();
        assert_eq!(t.file.as_deref(), Some("/usr/bin/x"));
        assert_eq!(t.func, sym("main", 16));
        let t = parse_target("libc.so.6:malloc").unwrap();
        assert_eq!(t.file.as_deref(), Some("libc.so.6"));
        assert_eq!(t.func, sym("malloc", 0));
        assert_eq!(parse_target("work").unwrap().file, None);
        assert_eq!(parse_target(":work").unwrap().func, sym("work", 0));
        assert_eq!(
            parse_target("/bin/x:0x1234").unwrap().func,
            FuncSpec::Offset(0x1234)
        );
        assert!(parse_target("/bin/x:").is_err());
        assert!(parse_target("f+zz").is_err());
    }

    #[test]
    fn missing_function_is_named() {
        let exe = std::env::current_exe().unwrap();
        let spec = parse_target("no_such_function_here").unwrap();
        let err = resolve("p", false, &spec, &exe).unwrap_err().to_string();
        assert!(err.contains("no function `no_such_function_here`"), "{err}");
        let spec = parse_target("/no/such/file:main").unwrap();
        let err = resolve("p", false, &spec, &exe).unwrap_err().to_string();
        assert!(err.contains("/no/such/file does not exist"), "{err}");
    }

    #[test]
    fn libc_malloc_resolves() {
        let exe = std::env::current_exe().unwrap();
        let spec = parse_target("libc.so.6:malloc").unwrap();
        let a = resolve("p", false, &spec, &exe).unwrap();
        assert!(a.file.is_absolute());
        assert_eq!(a.func_name.as_deref(), Some("malloc"));
    }
}
