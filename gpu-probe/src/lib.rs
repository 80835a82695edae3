//! Compiling a GPU probe: its map references made device addresses, its helpers lowered
//! for the GPU with the device runtime linked in, as a PTX function to splice; made once
//! per process and set of inputs ([`ProbeCompiler`]), and kept on disk between runs
//! ([`ProbeCache`]). GPU attach splices what this gives into the kernels.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bpftime_isa::Insn;
use bpftime_jit_ptx::{
    compile, ArrayMapLayout, CompileError, GpuEnv, ProbeAbi, PtxOptions, PtxProgram, PtxVersion,
};
use bpftime_prepare::MapRef;
use bpftime_runtime::GpuProbeKind;

use bpftime_gpu_device::cuda::DevicePtr;
use bpftime_gpu_device::device_maps::{config_ir, RuntimeConfig, RUNTIME_BITCODE};
use bpftime_gpu_ptx::ptx::{ProbePoint, ACCESS_OFFSETS, ACCESS_UNIFORM, ARG_OFFSETS, CTX_SIZE};

/// Where one of a probe's maps lives on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMapRef {
    /// The map's descriptor (`struct gpu_map`): what `lddw map` loads.
    pub desc: DevicePtr,
    /// The first value, for maps with values in place (arrays): where `lddw map_value`
    /// (global data) points, plus its offset.
    pub values: Option<DevicePtr>,
    /// How lookups inline, for arrays.
    pub array: Option<ArrayMapLayout>,
}

/// The ABI spliced calls at `point` use (see `ptx`): the kernel's six arguments, and an
/// access probe's six more, laid out as `pt_regs`. The kernel's arguments are the same in
/// every thread, and so are an access's site constants ([`ACCESS_UNIFORM`]).
pub fn probe_abi(point: ProbePoint) -> ProbeAbi {
    let (extra, extra_uniform): (&[usize], &[bool]) = match point {
        ProbePoint::Entry | ProbePoint::Exit => (&[], &[]),
        ProbePoint::Access | ProbePoint::SharedAccess => (&ACCESS_OFFSETS, &ACCESS_UNIFORM),
    };
    let mut uniform = (1u64 << ARG_OFFSETS.len()) - 1;
    for (i, _) in extra_uniform.iter().enumerate().filter(|(_, &u)| u) {
        uniform |= 1 << (ARG_OFFSETS.len() + i);
    }
    ProbeAbi::Arguments {
        size: CTX_SIZE as u32,
        offsets: ARG_OFFSETS.iter().chain(extra).map(|&o| o as u32).collect(),
        uniform,
    }
}

/// Compiles `insns` (store map ids in `lddw`s, as `maps` keys) into a PTX probe function
/// `symbol(..)` called at `point`, for `sm_XY`, with the device runtime of `config`
/// inlined. Fails, saying why, when the program needs something the GPU runtime does not
/// have.
pub fn compile_probe(
    point: ProbePoint,
    insns: &[Insn],
    maps: &HashMap<u32, DeviceMapRef>,
    config: &RuntimeConfig,
    sm: u32,
    symbol: &str,
) -> Result<PtxProgram, ProbeError> {
    let relocated = relocate(insns, maps)?;
    compile_relocated(point, &relocated, maps, config, sm, symbol)
}

/// [`compile_probe`] of instructions [`relocate`] already gave device addresses.
fn compile_relocated(
    point: ProbePoint,
    insns: &[Insn],
    maps: &HashMap<u32, DeviceMapRef>,
    config: &RuntimeConfig,
    sm: u32,
    symbol: &str,
) -> Result<PtxProgram, ProbeError> {
    let env = ProbeEnv {
        library: config_ir(config),
        arrays: maps
            .values()
            .filter_map(|m| Some((m.desc, m.array?)))
            .collect(),
    };
    let opts = PtxOptions {
        sm,
        ptx_version: PtxVersion::DEFAULT,
        symbol: symbol.to_string(),
        kernel: false,
        probe_abi: probe_abi(point),
        ..PtxOptions::default()
    };
    let program = compile(insns, &env, &opts)?;
    if !program.externs.is_empty() {
        return Err(ProbeError::MissingHelpers(program.externs));
    }
    Ok(program)
}

/// A probe's code, or why it cannot be made: filled once, by whoever asks first.
type Made = OnceLock<Result<CachedProbe, ProbeError>>;

/// The name a probe is compiled under before it takes the one its module gives it: the
/// same code is then the same text whichever module and place it goes to.
const ANY_SYMBOL: &str = "__bpftime_probe_any";

/// Compiles probes once per set of inputs in this process, and once per set of inputs
/// for good where the user's cache is on (see [`ProbeCache`]). Every module a probe goes
/// into (a tool's `cuda:*` probe meets each module the application loads, from any of its
/// threads) asks for the same code under the name it has there: the code is made once,
/// and a module that asks while another's build is making it waits for that work instead
/// of doing it again.
#[derive(Default)]
pub struct ProbeCompiler {
    disk: Option<ProbeCache>,
    /// Keyed like the disk cache; a cell is filled by whoever asked first.
    made: Mutex<HashMap<String, Arc<Made>>>,
    /// How many times LLVM ran.
    compilations: AtomicUsize,
}

impl ProbeCompiler {
    /// A compiler that keeps its work in `disk` as well, when given.
    pub fn new(disk: Option<ProbeCache>) -> ProbeCompiler {
        ProbeCompiler {
            disk,
            made: Mutex::new(HashMap::new()),
            compilations: AtomicUsize::new(0),
        }
    }

    /// How many probes this compiler handed to LLVM (the rest came from earlier work).
    pub fn compilations(&self) -> usize {
        self.compilations.load(Ordering::Relaxed)
    }

    /// [`compile_probe`], answered from what this compiler or the disk cache made from
    /// the same inputs before, under any symbol.
    pub fn compile(
        &self,
        point: ProbePoint,
        insns: &[Insn],
        maps: &HashMap<u32, DeviceMapRef>,
        config: &RuntimeConfig,
        sm: u32,
        symbol: &str,
    ) -> Result<CachedProbe, ProbeError> {
        // Keyed by what the code is made of: the instructions with their maps' device
        // addresses in place (not the store's map ids, which differ from run to run).
        let relocated = relocate(insns, maps)?;
        let mut arrays: Vec<_> = maps.values().map(|m| (m.desc, m.array)).collect();
        arrays.sort_by_key(|(desc, _)| *desc);
        let build = self.disk.as_ref().map_or("", |d| d.build.as_str());
        let key = format!("{build}\n{point:?}\nsm_{sm}\n{relocated:?}\n{arrays:?}\n{config:?}");
        let cell = self
            .made
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_default()
            .clone();
        let made = cell.get_or_init(|| {
            if let Some(hit) = self.disk.as_ref().and_then(|d| d.get(&key)) {
                return Ok(hit);
            }
            self.compilations.fetch_add(1, Ordering::Relaxed);
            let compiled = CachedProbe::from(compile_relocated(
                point, &relocated, maps, config, sm, ANY_SYMBOL,
            )?);
            if let Some(disk) = &self.disk {
                disk.put(&key, &compiled);
            }
            Ok(compiled)
        });
        made.as_ref().map(|p| p.named(symbol)).map_err(Clone::clone)
    }
}

/// What a compiled probe is spliced with: its PTX and its clock offset's global.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedProbe {
    pub ptx: String,
    pub clock_offset: Option<String>,
}

impl CachedProbe {
    /// The probe as `symbol(..)`, with its helpers and globals named after it.
    fn named(&self, symbol: &str) -> CachedProbe {
        CachedProbe {
            ptx: self.ptx.replace(ANY_SYMBOL, symbol),
            clock_offset: self
                .clock_offset
                .as_ref()
                .map(|c| c.replace(ANY_SYMBOL, symbol)),
        }
    }
}

impl From<PtxProgram> for CachedProbe {
    fn from(p: PtxProgram) -> CachedProbe {
        CachedProbe {
            ptx: p.ptx,
            clock_offset: p.clock_offset,
        }
    }
}

/// Compiled probes on disk, one file per set of inputs, each holding its inputs in full
/// (a hash names the file; the inputs decide a hit).
#[derive(Debug, Clone)]
pub struct ProbeCache {
    dir: PathBuf,
    /// This build of bpftime: a rebuilt compiler never answers from an older one's work.
    build: String,
}

/// Files kept: past this, the oldest half goes.
const CACHE_FILES: usize = 1024;

impl ProbeCache {
    /// The cache at `dir`, for compilers built as `build` says.
    pub fn at(dir: impl Into<PathBuf>, build: impl Into<String>) -> ProbeCache {
        ProbeCache {
            dir: dir.into(),
            build: build.into(),
        }
    }

    /// Where a user's cache is: `BPFTIME_CACHE_DIR`, else `$XDG_CACHE_HOME/bpftime`, else
    /// `~/.cache/bpftime`, under `gpu-probes`; `None` with `BPFTIME_CACHE_DISABLE=1` (as
    /// `CUDA_CACHE_DISABLE` turns off the driver's) or without a home.
    pub fn for_user() -> Option<ProbeCache> {
        if std::env::var("BPFTIME_CACHE_DISABLE").is_ok_and(|v| v == "1") {
            return None;
        }
        let env_dir = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        let root = env_dir("BPFTIME_CACHE_DIR")
            .map(PathBuf::from)
            .or_else(|| env_dir("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("bpftime")))
            .or_else(|| env_dir("HOME").map(|d| PathBuf::from(d).join(".cache/bpftime")))?;
        Some(ProbeCache::at(root.join("gpu-probes"), this_build()?))
    }

    fn file(&self, key: &str) -> PathBuf {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut h);
        self.dir.join(format!("{:016x}.probe", h.finish()))
    }

    fn get(&self, key: &str) -> Option<CachedProbe> {
        let text = std::fs::read_to_string(self.file(key)).ok()?;
        let mut parts = text.splitn(3, '\0');
        if parts.next()? != key {
            return None;
        }
        let clock = parts.next()?;
        let ptx = parts.next()?;
        Some(CachedProbe {
            ptx: ptx.to_string(),
            clock_offset: (!clock.is_empty()).then(|| clock.to_string()),
        })
    }

    /// Best effort: a cache that cannot be written costs the next run a compilation.
    fn put(&self, key: &str, probe: &CachedProbe) {
        if let Err(e) = self.try_put(key, probe) {
            tracing::debug!(dir = %self.dir.display(), "GPU probe cache not written: {e}");
        }
    }

    fn try_put(&self, key: &str, probe: &CachedProbe) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let file = self.file(key);
        let tmp = file.with_extension(format!("tmp{}", std::process::id()));
        let clock = probe.clock_offset.as_deref().unwrap_or("");
        std::fs::write(&tmp, format!("{key}\0{clock}\0{}", probe.ptx))?;
        std::fs::rename(&tmp, &file)?;
        trim(&self.dir, CACHE_FILES);
        Ok(())
    }
}

/// Removes the older half of `dir`'s probes once it holds more than `most`.
fn trim(dir: &Path, most: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "probe"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    if files.len() <= most {
        return;
    }
    files.sort();
    for (_, path) in &files[..files.len() - most / 2] {
        let _ = std::fs::remove_file(path);
    }
}

/// The object this code was loaded from (the agent's library, or a binary), by its path,
/// size and modification time: what changes whenever bpftime is rebuilt.
fn this_build() -> Option<String> {
    static BUILD: OnceLock<Option<String>> = OnceLock::new();
    BUILD
        .get_or_init(|| {
            // SAFETY: Dl_info is plain pointers and integers, for which zero is valid.
            let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
            // SAFETY: dladdr reads our own function's address and fills `info` with
            // pointers into the loader's data, which live as long as the object.
            let found = unsafe { libc::dladdr(this_build as *const libc::c_void, &mut info) };
            let loaded = (found != 0 && !info.dli_fname.is_null()).then(|| {
                use std::os::unix::ffi::OsStrExt;
                // SAFETY: a NUL-terminated path the loader keeps.
                let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
                PathBuf::from(std::ffi::OsStr::from_bytes(name.to_bytes()))
            });
            // The main program's name may be bare; /proc says where it is.
            let (path, meta) = loaded
                .and_then(|p| Some((p.clone(), std::fs::metadata(&p).ok()?)))
                .or_else(|| {
                    let p = std::fs::read_link("/proc/self/exe").ok()?;
                    Some((p.clone(), std::fs::metadata(&p).ok()?))
                })?;
            let modified = meta
                .modified()
                .ok()?
                .duration_since(std::time::UNIX_EPOCH)
                .ok()?;
            Some(format!(
                "{} {} {} {}",
                env!("CARGO_PKG_VERSION"),
                path.display(),
                meta.len(),
                modified.as_nanos()
            ))
        })
        .clone()
}

/// Why a probe's code cannot be made. `Clone`: the answer is kept for everyone who asks
/// for the same code.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProbeError {
    #[error("map {0} is not among the program's maps")]
    MapNotInProgram(u32),
    #[error("map {0} has no values to point into")]
    MapWithoutValues(u32),
    #[error(transparent)]
    Compile(Arc<CompileError>),
    #[error("it calls helpers the GPU runtime lacks: {}", .0.join(", "))]
    MissingHelpers(Vec<String>),
}

impl From<CompileError> for ProbeError {
    fn from(e: CompileError) -> Self {
        ProbeError::Compile(Arc::new(e))
    }
}

/// Where in a kernel a program of `kind` is spliced; `None` for a launch program, which
/// runs on the CPU at each launch (GPU attach's `launch`).
pub fn probe_point(kind: GpuProbeKind) -> Option<ProbePoint> {
    match kind {
        GpuProbeKind::Entry => Some(ProbePoint::Entry),
        GpuProbeKind::Exit => Some(ProbePoint::Exit),
        GpuProbeKind::Access => Some(ProbePoint::Access),
        GpuProbeKind::SharedAccess => Some(ProbePoint::SharedAccess),
        GpuProbeKind::Launch => None,
    }
}

/// Rewrites `lddw` map references (store ids) into device addresses: a map becomes its
/// replica's descriptor, a map value (global data) the replica's first value plus the
/// offset.
fn relocate(insns: &[Insn], maps: &HashMap<u32, DeviceMapRef>) -> Result<Vec<Insn>, ProbeError> {
    bpftime_prepare::relocate(insns, |r| {
        let id = r.map();
        let m = maps.get(&id).ok_or(ProbeError::MapNotInProgram(id))?;
        match r {
            MapRef::Map(_) => Ok(m.desc),
            MapRef::Value { offset, .. } => m
                .values
                .map(|v| v + u64::from(offset))
                .ok_or(ProbeError::MapWithoutValues(id)),
        }
    })
}

/// The helpers, inlined array maps and device runtime a probe is compiled with.
struct ProbeEnv {
    /// The runtime's configuration, as text IR (the runtime itself is bitcode).
    library: String,
    arrays: HashMap<DevicePtr, ArrayMapLayout>,
}

impl GpuEnv for ProbeEnv {
    fn array_map(&self, map: u64) -> Option<ArrayMapLayout> {
        self.arrays.get(&map).copied()
    }

    fn array_maps(&self) -> Vec<ArrayMapLayout> {
        self.arrays.values().copied().collect()
    }

    fn library(&self) -> Option<&str> {
        Some(&self.library)
    }

    fn library_bitcode(&self) -> Option<&[u8]> {
        Some(RUNTIME_BITCODE)
    }
}
