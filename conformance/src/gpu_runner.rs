//! The stand-alone GPU runner: a program compiled by `bpftime-jit-ptx` runs as a kernel of
//! its own over a buffer (the conformance suite's GPU engine, the helper checks and the
//! clock's reference launches), through cudarc's driver API on GPU 0.
//!
//! cudarc panics when the driver library is missing, so [`check_libcuda`] opens
//! `libcuda.so.1` itself first and every CUDA call happens after it succeeded.

use std::ffi::CStr;
use std::sync::{Arc, Mutex, OnceLock};

use bpftime_jit_ptx::{compile, PtxOptions, PtxProgram, StandardGpuEnv};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use bpftime_gpu_device::clock::{self, ClockCalibration, CLOCK_REANCHOR};

/// The name of the driver library, as the loader finds it.
pub const LIBCUDA: &str = "libcuda.so.1";

/// Whether the NVIDIA driver library can be loaded, and if not, why, in words a user
/// can act on. Checked once; the library stays loaded.
pub fn check_libcuda() -> Result<(), String> {
    static RESULT: OnceLock<Result<(), String>> = OnceLock::new();
    RESULT
        .get_or_init(|| {
            // SAFETY: dlopen with a NUL-terminated constant name; the handle is never
            // closed, so the library stays resident for cudarc's own load.
            let handle = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
            if !handle.is_null() {
                return Ok(());
            }
            // SAFETY: dlerror returns NULL or a NUL-terminated message that stays
            // valid until the next dl* call on this thread; it is copied at once.
            let reason = unsafe {
                let e = libc::dlerror();
                if e.is_null() {
                    "no reason given".to_string()
                } else {
                    CStr::from_ptr(e).to_string_lossy().into_owned()
                }
            };
            Err(format!(
                "{LIBCUDA} cannot be loaded ({reason}): the gpu engine needs an NVIDIA GPU and \
                 its driver; run it on a machine with one"
            ))
        })
        .clone()
}

/// Why a GPU run failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuRunError {
    /// The program did not compile; the device is untouched.
    Compile(String),
    /// No usable GPU (no driver, no device).
    Unavailable(String),
    /// The driver refused the module or the launch failed; a failed launch can leave
    /// the context unusable, so callers should not trust later runs in this process.
    Device(String),
}

impl std::fmt::Display for GpuRunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GpuRunError::Compile(e) => write!(f, "PTX compilation failed: {e}"),
            GpuRunError::Unavailable(e) => write!(f, "no GPU: {e}"),
            GpuRunError::Device(e) => write!(f, "GPU: {e}"),
        }
    }
}

/// The first GPU and a stream on it.
pub struct GpuDevice {
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    clock: Mutex<Option<ClockCalibration>>,
    /// The program that reads the raw global timer, loaded at the first calibration.
    timer: OnceLock<LoadedProgram>,
}

/// A program's module, loaded on the device.
pub struct LoadedProgram {
    module: Arc<CudaModule>,
    kernel: CudaFunction,
    clock_offset: Option<String>,
}

impl GpuDevice {
    /// Opens GPU 0, after checking that the driver library loads.
    pub fn open() -> Result<Self, GpuRunError> {
        check_libcuda().map_err(GpuRunError::Unavailable)?;
        let context = CudaContext::new(0)
            .map_err(|e| GpuRunError::Unavailable(format!("cannot open GPU 0: {e}")))?;
        let stream = context.default_stream();
        Ok(GpuDevice {
            context,
            stream,
            clock: Mutex::new(None),
            timer: OnceLock::new(),
        })
    }

    /// The device's name, as the driver reports it.
    pub fn name(&self) -> String {
        self.context
            .name()
            .unwrap_or_else(|e| format!("unknown ({e})"))
    }

    /// Number of streaming multiprocessors.
    pub fn sm_count(&self) -> Result<u32, GpuRunError> {
        use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
        self.context
            .attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map(|n| n as u32)
            .map_err(|e| GpuRunError::Device(e.to_string()))
    }

    /// Loads `program`'s module.
    pub fn load(&self, program: &PtxProgram) -> Result<LoadedProgram, GpuRunError> {
        let module = self
            .context
            .load_module(Ptx::from_src(program.ptx.clone()))
            .map_err(|e| device_error("loading the PTX module", e))?;
        let name = program.kernel.as_deref().ok_or_else(|| {
            GpuRunError::Compile("the program was compiled without its kernel".into())
        })?;
        let kernel = module
            .load_function(name)
            .map_err(|e| device_error("finding the kernel", e))?;
        Ok(LoadedProgram {
            module,
            kernel,
            clock_offset: program.clock_offset.clone(),
        })
    }

    /// Measures the global timer against the host clock: [`CLOCK_SAMPLES`] one-thread
    /// launches of a program that returns helper 502, each bracketed by host readings.
    pub fn calibrate_clock(&self) -> Result<ClockCalibration, GpuRunError> {
        let loaded = match self.timer.get() {
            Some(l) => l,
            None => {
                let prog = bpftime_isa::asm::assemble("call 502\nexit")
                    .map_err(|e| GpuRunError::Compile(e.to_string()))?;
                let program = compile(&prog, &StandardGpuEnv, &PtxOptions::default())
                    .map_err(|e| GpuRunError::Compile(e.to_string()))?;
                let loaded = self.load(&program)?;
                self.timer.get_or_init(|| loaded)
            }
        };
        clock::calibrate(|| self.run(loaded, &mut [], ONE_THREAD))
            .map_err(|e| e.either(GpuRunError::Device("no clock sample was usable".into())))
    }

    /// The current calibration, taken anew when older than [`CLOCK_REANCHOR`].
    pub fn clock(&self) -> Result<ClockCalibration, GpuRunError> {
        let mut clock = self.clock.lock().unwrap_or_else(|e| e.into_inner());
        match *clock {
            Some(c) if c.taken.elapsed() < CLOCK_REANCHOR => Ok(c),
            _ => {
                let c = self.calibrate_clock()?;
                *clock = Some(c);
                Ok(c)
            }
        }
    }

    /// Runs `program`'s kernel with `config` over a device copy of `mem` (r1 = its
    /// address, r2 = its length), copies `mem` back and returns the r0 the kernel
    /// stored (with several threads, the last one to store wins). A program that reads
    /// `ktime_get_ns` gets the host clock's offset written first.
    pub fn run(
        &self,
        program: &LoadedProgram,
        mem: &mut [u8],
        config: LaunchConfig,
    ) -> Result<u64, GpuRunError> {
        if let Some(name) = &program.clock_offset {
            let offset = self.clock()?.offset_ns;
            let mut global = program
                .module
                .get_global(name, &self.stream)
                .map_err(|e| device_error("finding the clock offset", e))?;
            self.stream
                .memcpy_htod(&offset.to_le_bytes(), &mut global)
                .map_err(|e| device_error("writing the clock offset", e))?;
        }
        // An empty buffer still needs a valid allocation; r2 says it is empty.
        let host: &[u8] = if mem.is_empty() { &[0] } else { mem };
        let mut buffer = self
            .stream
            .clone_htod(host)
            .map_err(|e| device_error("copying memory in", e))?;
        // Poisoned, so that a kernel that never stores r0 cannot pass.
        let poison = [0xdead_beef_dead_beef_u64];
        let mut result = self
            .stream
            .clone_htod(&poison[..])
            .map_err(|e| device_error("allocating the result", e))?;
        let len = mem.len() as u64;
        let mut launch = self.stream.launch_builder(&program.kernel);
        launch.arg(&mut buffer).arg(&len).arg(&mut result);
        // SAFETY: the kernel's parameters are (u64 pointer, u64, u64 pointer), matching
        // the buffer, the length and the one-u64 result pushed above; the program
        // touches only memory inside `buffer` and its own stack (the conformance
        // programs, like any verified program, stay within r1..r1+r2).
        unsafe { launch.launch(config) }.map_err(|e| device_error("launching", e))?;
        self.stream
            .synchronize()
            .map_err(|e| device_error("running the kernel", e))?;
        let r0 = self
            .stream
            .clone_dtoh(&result)
            .map_err(|e| device_error("copying r0 out", e))?;
        if !mem.is_empty() {
            self.stream
                .memcpy_dtoh(&buffer, mem)
                .map_err(|e| device_error("copying memory out", e))?;
        }
        r0.first()
            .copied()
            .ok_or_else(|| GpuRunError::Device("no r0 came back".into()))
    }

    /// [`load`](Self::load) and [`run`](Self::run) in one.
    pub fn launch(
        &self,
        program: &PtxProgram,
        mem: &mut [u8],
        config: LaunchConfig,
    ) -> Result<u64, GpuRunError> {
        let loaded = self.load(program)?;
        self.run(&loaded, mem, config)
    }
}

fn device_error(what: &str, e: cudarc::driver::DriverError) -> GpuRunError {
    GpuRunError::Device(format!("{what}: {e}"))
}

/// One thread, one block.
pub const ONE_THREAD: LaunchConfig = LaunchConfig {
    grid_dim: (1, 1, 1),
    block_dim: (1, 1, 1),
    shared_mem_bytes: 0,
};
