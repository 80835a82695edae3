//! Starting GPU attach in a process: the loaded driver resolved, its entry points
//! detoured, then the session started over the originals. The one place that knows both
//! the interception (`entry_points`) and the session, so that neither imports the other's
//! start.

use std::sync::Mutex;

use bpftime_gpu_device::cuda;

use crate::session::{self, GpuAttach, InstallError};

/// Starts GPU attach in this process: resolves the loaded driver and intercepts it. Call
/// once libcuda is loaded (never loads it); later calls return the same session.
pub fn install() -> Result<&'static GpuAttach, InstallError> {
    static INSTALL: Mutex<()> = Mutex::new(());
    let _once = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = session::installed() {
        return Ok(s);
    }
    let lib = cuda::loaded_libcuda().ok_or(InstallError::NotLoaded(cuda::LIBCUDA))?;
    let mut api = cuda::api_from(lib).map_err(|e| InstallError::Driver(e.to_string()))?;
    let driver_version = api.driver_version().unwrap_or(0);
    // The replacements pass calls straight through until the session is in place, so
    // the detours go in first and our own calls then use the originals they leave.
    // SAFETY: the driver's handle and the entry points resolved from it.
    let detours = unsafe { crate::entry_points::install(lib.handle(), &mut api) };
    let s = session::start(api, driver_version)?;
    tracing::info!(
        entry_points = detours,
        driver = driver_version,
        "GPU attach: CUDA driver intercepted"
    );
    Ok(s)
}
