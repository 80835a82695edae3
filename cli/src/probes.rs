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

/// Finds a library given by name (`libc.so.6`) where the dynamic loader would
/// find it for `app`: `LD_LIBRARY_PATH`, the app's own run path (RPATH or RUNPATH,
/// `$ORIGIN` read as its directory), the copy this process has loaded, the
/// directories of /etc/ld.so.conf and its includes (what ldconfig caches: CUDA's
/// packages put theirs there), then the system directories; an executable name is
/// looked up on `PATH`.
pub fn find_library(name: &str, app: Option<&Path>) -> Option<PathBuf> {
    let from_env = std::env::var_os("LD_LIBRARY_PATH")
        .map(|v| std::env::split_paths(&v).collect::<Vec<_>>())
        .unwrap_or_default();
    if let Some(p) = from_env.iter().map(|d| d.join(name)).find(|p| p.is_file()) {
        return Some(p);
    }
    if let Some(p) = app
        .map(run_path)
        .unwrap_or_default()
        .iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
    {
        return Some(p);
    }
    if !name.contains('/') {
        if let Ok(p) = bpftime_attach::resolve_binary(Path::new(name)) {
            return Some(p);
        }
    }
    if let Some(p) = ld_so_conf_dirs(Path::new("/etc/ld.so.conf"))
        .iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
    {
        return Some(p);
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

/// The directories of an executable's DT_RUNPATH (or, without one, DT_RPATH), with
/// `$ORIGIN` replaced by the executable's directory; none when it cannot be read.
fn run_path(app: &Path) -> Vec<PathBuf> {
    let Ok(bytes) = std::fs::read(app) else {
        return Vec::new();
    };
    let Ok(elf) = Elf::parse(&bytes) else {
        return Vec::new();
    };
    let origin = std::fs::canonicalize(app)
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    let origin = origin.to_string_lossy();
    let paths = if elf.runpaths.is_empty() {
        &elf.rpaths
    } else {
        &elf.runpaths
    };
    paths
        .iter()
        .flat_map(|p| p.split(':'))
        .filter(|d| !d.is_empty())
        .map(|d| PathBuf::from(d.replace("${ORIGIN}", &origin).replace("$ORIGIN", &origin)))
        .collect()
}

/// The library directories an ld.so.conf names, its `include` lines followed (a
/// pattern's `*` matches within one file name, as the loader's glob), in order.
fn ld_so_conf_dirs(conf: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    read_ld_so_conf(conf, &mut dirs, 0);
    dirs
}

fn read_ld_so_conf(conf: &Path, dirs: &mut Vec<PathBuf>, depth: u32) {
    // Includes that include each other end here.
    if depth > 8 {
        return;
    }
    let Ok(text) = std::fs::read_to_string(conf) else {
        return;
    };
    let base = conf.parent().unwrap_or(Path::new("/"));
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if let Some(pattern) = line
            .strip_prefix("include")
            .filter(|r| r.starts_with([' ', '\t']))
        {
            for pattern in pattern.split_whitespace() {
                for file in glob_files(&base.join(pattern)) {
                    read_ld_so_conf(&file, dirs, depth + 1);
                }
            }
        } else if !line.starts_with("hwcap") {
            dirs.extend(
                line.split([' ', '\t', ',', ':'])
                    .filter(|d| d.starts_with('/'))
                    .map(PathBuf::from),
            );
        }
    }
}

/// The files a pattern whose last component may hold `*` names, sorted.
fn glob_files(pattern: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(name)) = (pattern.parent(), pattern.file_name()) else {
        return Vec::new();
    };
    let name = name.to_string_lossy();
    let Some((prefix, suffix)) = name.split_once('*') else {
        return if pattern.is_file() {
            vec![pattern.to_path_buf()]
        } else {
            Vec::new()
        };
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.len() >= prefix.len() + suffix.len() && n.starts_with(prefix) && n.ends_with(suffix)
        })
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
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
        Some(f) => find_library(f, Some(app)).ok_or_else(|| {
            anyhow!(
                "program `{prog}`: cannot find `{f}` (looked in LD_LIBRARY_PATH, the app's run path, the libraries bpftime has loaded, /etc/ld.so.conf's directories, the system library directories and PATH); give its full path"
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

    /// As the loader reads it: comments, an include by pattern (sorted, only files
    /// that match), nested includes, several directories on a line, hwcap lines left.
    #[test]
    fn ld_so_conf_is_read_with_its_includes() {
        let root = std::env::temp_dir().join(format!("bpftime-ldconf-{}", std::process::id()));
        let d = root.join("ld.so.conf.d");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            root.join("ld.so.conf"),
            "# top\n/opt/first\ninclude ld.so.conf.d/*.conf\nhwcap 0 x\n/opt/a /opt/b\n",
        )
        .unwrap();
        std::fs::write(d.join("20-cuda.conf"), "/usr/local/cuda/lib64 # cuda\n").unwrap();
        std::fs::write(d.join("10-x.conf"), "include ../more.conf\n").unwrap();
        std::fs::write(root.join("more.conf"), "/opt/more\n").unwrap();
        std::fs::write(d.join("README"), "/not/a/conf\n").unwrap();
        let dirs = ld_so_conf_dirs(&root.join("ld.so.conf"));
        std::fs::remove_dir_all(&root).unwrap();
        let want: Vec<PathBuf> = [
            "/opt/first",
            "/opt/more",
            "/usr/local/cuda/lib64",
            "/opt/a",
            "/opt/b",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(dirs, want);
    }

    /// A library found only through the app's RUNPATH, `$ORIGIN` read as the app's
    /// directory.
    #[test]
    fn a_library_on_the_apps_run_path_is_found() {
        let root = std::env::temp_dir().join(format!("bpftime-runpath-{}", std::process::id()));
        std::fs::create_dir_all(root.join("lib")).unwrap();
        let app = root.join("app");
        let cc = std::process::Command::new("cc")
            .args(["-x", "c", "-", "-o"])
            .arg(&app)
            .arg("-Wl,--enable-new-dtags,-rpath,$ORIGIN/lib")
            .stdin(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin
                    .take()
                    .unwrap()
                    .write_all(b"int main(void){return 0;}\n")?;
                c.wait()
            })
            .expect("cc");
        assert!(cc.success());
        let lib = root.join("lib/libonly-here.so.1");
        std::fs::copy("/bin/true", &lib).unwrap();
        let found = find_library("libonly-here.so.1", Some(&app));
        let elsewhere = find_library("libonly-here.so.1", None);
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(
            found,
            Some(
                std::fs::canonicalize(std::env::temp_dir())
                    .unwrap()
                    .join(format!(
                        "bpftime-runpath-{}/lib/libonly-here.so.1",
                        std::process::id()
                    ))
            )
        );
        assert_eq!(elsewhere, None);
    }

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
