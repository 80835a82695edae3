//! NVIDIA's compilers on a machine without a GPU: `ptxas` checks generated PTX and `nvcc`
//! builds the CUDA test programs. Both come from the PyPI `nvidia-cuda-nvcc` wheel that
//! scripts/setup.sh installs, from `PATH`, or from `PTXAS` / `NVCC`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `bin` folders of pip's NVIDIA wheels (`nvidia/cu13/bin` in CUDA 13's wheels,
/// `nvidia/cuda_nvcc/bin` in older ones).
fn pip_bins() -> Vec<PathBuf> {
    let Ok(out) = Command::new("python3")
        .args(["-c", "import nvidia; print('\\n'.join(nvidia.__path__))"])
        .output()
    else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .flat_map(|dir| ["cu13/bin", "cuda_nvcc/bin"].map(|sub| Path::new(dir).join(sub)))
        .filter(|p| p.is_dir())
        .collect()
}

/// `tool` (`ptxas`, `nvcc`) from the environment variable `env`, then `PATH`, then
/// /usr/local/cuda/bin, then pip's wheel.
pub fn find(tool: &str, env: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Some(PathBuf::from(p));
    }
    let on_path = Command::new(tool).arg("--version").output();
    if on_path.is_ok_and(|o| o.status.success()) {
        return Some(PathBuf::from(tool));
    }
    let cuda = Path::new("/usr/local/cuda/bin").join(tool);
    if cuda.is_file() {
        return Some(cuda);
    }
    pip_bins()
        .into_iter()
        .map(|dir| dir.join(tool))
        .find(|p| p.is_file())
}

/// `ptxas`, found as [`find`] says.
pub fn find_ptxas() -> Option<PathBuf> {
    find("ptxas", "PTXAS")
}

/// Why `ptxas` did not accept a file.
#[derive(Debug, thiserror::Error)]
pub enum PtxasError {
    #[error("{ptxas} does not run: {source}")]
    NotRun {
        ptxas: String,
        source: std::io::Error,
    },
    /// ptxas ran and refused the PTX; its own words.
    #[error("{0}")]
    Refused(String),
    #[error("cannot write {path} for ptxas: {source}")]
    Scratch {
        path: String,
        source: std::io::Error,
    },
}

/// Runs `ptxas` on the PTX `text` for `sm_XY` ([`run_ptxas`]), from a scratch directory
/// of its own that is removed afterwards: ptxas writes its cubin beside its input, which
/// must be neither the source tree nor a file another check is writing. `name` names the
/// file, for ptxas's messages.
pub fn ptxas_accepts(
    ptxas: &Path,
    name: &str,
    text: &str,
    sm: u32,
    relocatable: bool,
) -> Result<(), PtxasError> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("bpftime-ptxas-{}-{n}", std::process::id()));
    let file = dir.join(format!("{name}.ptx"));
    let scratch = |source| PtxasError::Scratch {
        path: file.display().to_string(),
        source,
    };
    std::fs::create_dir_all(&dir).map_err(scratch)?;
    let r = std::fs::write(&file, text)
        .map_err(scratch)
        .and_then(|()| run_ptxas(ptxas, &file, sm, relocatable));
    let _ = std::fs::remove_dir_all(&dir);
    r
}

/// Runs `ptxas` on `file` for `sm_XY`; `relocatable` (`-c`) when the PTX calls device
/// functions that are linked later. Returns ptxas's complaint on failure.
pub fn run_ptxas(ptxas: &Path, file: &Path, sm: u32, relocatable: bool) -> Result<(), PtxasError> {
    let mut cmd = Command::new(ptxas);
    cmd.arg(format!("-arch=sm_{sm}"));
    if relocatable {
        cmd.arg("-c");
    }
    let out = cmd
        .arg(file)
        .arg("-o")
        .arg(file.with_extension("cubin"))
        .output()
        .map_err(|source| PtxasError::NotRun {
            ptxas: ptxas.display().to_string(),
            source,
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(PtxasError::Refused(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ))
    }
}

/// `ptxas` for a test that checks PTX: `None` (saying why on stderr) when
/// `BPFTIME_NO_PTXAS` is set; a panic naming the way out when there is none; otherwise
/// its path, its version said on stderr.
pub fn ptxas_for_tests() -> Option<PathBuf> {
    if let Some(why) = std::env::var_os("BPFTIME_NO_PTXAS") {
        eprintln!(
            "BPFTIME_NO_PTXAS is set ({}): not checking PTX with ptxas",
            why.to_string_lossy()
        );
        return None;
    }
    let ptxas = find_ptxas().unwrap_or_else(|| {
        panic!(
            "ptxas not found (tried $PTXAS, PATH, /usr/local/cuda/bin and pip's \
             nvidia-cuda-nvcc); run scripts/setup.sh, which installs it with pip, or set \
             PTXAS=/path/to/ptxas (BPFTIME_NO_PTXAS=reason skips these checks)"
        )
    });
    let version = Command::new(&ptxas)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("{} does not run: {e}", ptxas.display()));
    eprintln!(
        "using {}: {}",
        ptxas.display(),
        String::from_utf8_lossy(&version.stdout)
            .lines()
            .last()
            .unwrap_or("")
    );
    Some(ptxas)
}
