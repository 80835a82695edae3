//! Device memory for GPU attach at addresses that repeat from one run to the next.
//!
//! A probe's compiled code holds its maps' device addresses as constants (that is what
//! lets an array lookup fold to one address). The instrumented PTX of a kernel is then the
//! same text in two runs of a tool only when those addresses are the same, and the same
//! text is what lets the driver's JIT cache (and ours of the probes' PTX, in `probe`)
//! answer a second run with a lookup instead of tens of milliseconds of compilation.
//! `cuMemAlloc` places memory where ASLR put the driver's heap; an arena reserved at a
//! fixed virtual address and handed out in allocation order does not move.
//!
//! Nothing is freed before the context goes, as with the `cuMemAlloc`s it stands in for.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use crate::cuda::{
    Api, CudaError, DevicePtr, MemAccessDesc, MemAllocationProp, MemLocation, VmmApi,
    MEM_ACCESS_READ_WRITE, MEM_ALLOCATION_PINNED, MEM_LOCATION_DEVICE,
};

/// Where the first arena asks to be: far from the heap and the libraries (at 0x55.. and
/// 0x7f.. under Linux's ASLR) and from where the driver reserves its own ranges.
const FIRST_ARENA: DevicePtr = 0x3000_0000_0000;
/// The virtual range each arena reserves (physical memory is mapped as it fills).
const ARENA_SPAN: usize = 64 << 30;
/// Every allocation starts at a multiple of this, as `cuMemAlloc`'s do.
const ALIGN: u64 = 256;
/// Physical memory is mapped in steps of at least this.
const MAP_STEP: u64 = 2 << 20;
/// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`.
const ATTR_VMM_SUPPORTED: i32 = 102;
/// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`.
const GRANULARITY_MINIMUM: i32 = 0;

/// Arenas made in this process: the n-th asks for the n-th range, so a program that
/// makes its contexts in the same order gets the same addresses each run.
static ARENAS: AtomicU32 = AtomicU32::new(0);

/// Why an arena could not be made or grown.
#[derive(Debug, thiserror::Error)]
pub enum ArenaError {
    #[error("the driver has no virtual memory management calls")]
    NoVmm,
    #[error("device {0} does not support virtual memory management")]
    Unsupported(i32),
    #[error("the arena's {0} bytes are used up")]
    Full(usize),
    #[error(transparent)]
    Cuda(#[from] CudaError),
}

/// A virtual range on one device, mapped as it fills and handed out in order.
pub struct Arena {
    vmm: VmmApi,
    device: i32,
    base: DevicePtr,
    granularity: u64,
    used: Mutex<Used>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Used {
    /// Bytes handed out.
    top: u64,
    /// Bytes backed by physical memory.
    mapped: u64,
}

/// Where an allocation of `bytes` goes, and what must be mapped first (`map_len` bytes
/// at offset `used.mapped`; 0 when nothing), or `None` past `span`.
fn plan(used: Used, bytes: u64, granularity: u64, span: u64) -> Option<(u64, u64, Used)> {
    let at = used.top.div_ceil(ALIGN) * ALIGN;
    let top = at.checked_add(bytes.max(1))?;
    if top > span {
        return None;
    }
    let step = MAP_STEP.max(granularity).div_ceil(granularity) * granularity;
    let mapped = if top <= used.mapped {
        used.mapped
    } else {
        (top - used.mapped).div_ceil(step) * step + used.mapped
    };
    (mapped <= span).then_some((at, mapped - used.mapped, Used { top, mapped }))
}

impl Arena {
    /// Reserves the next range for `device` (the current context's). The address is the
    /// one asked for unless something else already holds it; then it is the driver's
    /// choice, and the run's addresses are its own.
    pub fn new(api: &Api, device: i32) -> Result<Arena, ArenaError> {
        let vmm = api.vmm.ok_or(ArenaError::NoVmm)?;
        if api.device_attribute(ATTR_VMM_SUPPORTED)? == 0 {
            return Err(ArenaError::Unsupported(device));
        }
        let prop = Self::prop(device);
        let mut granularity = 0usize;
        // SAFETY: reads `prop`, writes one size.
        api.check("cuMemGetAllocationGranularity", unsafe {
            (vmm.granularity)(&mut granularity, &prop, GRANULARITY_MINIMUM)
        })?;
        let n = ARENAS.fetch_add(1, Ordering::Relaxed) as u64;
        let wanted = FIRST_ARENA + n * ARENA_SPAN as u64;
        let mut base = 0;
        // SAFETY: writes one device pointer; reserves address space only.
        api.check("cuMemAddressReserve", unsafe {
            (vmm.address_reserve)(&mut base, ARENA_SPAN, 0, wanted, 0)
        })?;
        if base != wanted {
            tracing::debug!(
                wanted = format_args!("{wanted:#x}"),
                got = format_args!("{base:#x}"),
                "GPU attach's device memory is not where earlier runs had it: their compiled \
                 instrumented modules will not be reused"
            );
        }
        Ok(Arena {
            vmm,
            device,
            base,
            granularity: granularity.max(1) as u64,
            used: Mutex::new(Used::default()),
        })
    }

    fn prop(device: i32) -> MemAllocationProp {
        MemAllocationProp {
            kind: MEM_ALLOCATION_PINNED,
            requested_handle_types: 0,
            location: MemLocation {
                kind: MEM_LOCATION_DEVICE,
                id: device,
            },
            win32_metadata: std::ptr::null_mut(),
            flags: [0; 8],
        }
    }

    /// `bytes` of device memory, 256-byte aligned, after the last allocation.
    pub fn alloc(&self, api: &Api, bytes: usize) -> Result<DevicePtr, ArenaError> {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        let (at, map_len, next) = plan(*used, bytes as u64, self.granularity, ARENA_SPAN as u64)
            .ok_or(ArenaError::Full(ARENA_SPAN))?;
        if map_len > 0 {
            self.map(api, self.base + used.mapped, map_len as usize)?;
        }
        *used = next;
        Ok(self.base + at)
    }

    /// Backs `[at, at + len)` with new physical memory, readable and writable by the
    /// device.
    fn map(&self, api: &Api, at: DevicePtr, len: usize) -> Result<(), CudaError> {
        let prop = Self::prop(self.device);
        let mut handle = 0u64;
        // SAFETY: reads `prop`; writes one allocation handle.
        api.check("cuMemCreate", unsafe {
            (self.vmm.create)(&mut handle, len, &prop, 0)
        })?;
        // SAFETY: maps the whole new allocation into our reserved, unmapped range.
        let mapped = api.check("cuMemMap", unsafe { (self.vmm.map)(at, len, 0, handle, 0) });
        // The mapping keeps the memory alive; the handle is not needed after it.
        // SAFETY: our handle, released once.
        let _ = unsafe { (self.vmm.release)(handle) };
        mapped?;
        let access = MemAccessDesc {
            location: prop.location,
            flags: MEM_ACCESS_READ_WRITE,
        };
        // SAFETY: the range just mapped; reads one access descriptor.
        api.check("cuMemSetAccess", unsafe {
            (self.vmm.set_access)(at, len, &access, 1)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_aligned_in_order_and_mapped_in_steps() {
        let g = 2 << 20;
        let span = 64 << 20;
        let (at, map, used) = plan(Used::default(), 8, g, span).unwrap();
        assert_eq!((at, map), (0, 2 << 20));
        let (at, map, used) = plan(used, 100, g, span).unwrap();
        assert_eq!((at, map), (256, 0));
        // A large one maps what it lacks, rounded up to the step.
        let (at, map, used) = plan(used, 5 << 20, g, span).unwrap();
        assert_eq!(at, 512);
        assert_eq!(map, 4 << 20);
        assert_eq!(used.mapped, 6 << 20);
        assert_eq!(used.top, 512 + (5 << 20));
        // A granularity larger than the step is the step.
        let (_, map, _) = plan(Used::default(), 1, 4 << 20, span).unwrap();
        assert_eq!(map, 4 << 20);
        // Zero bytes still take a distinct address.
        let (a, _, u) = plan(Used::default(), 0, g, span).unwrap();
        let (b, _, _) = plan(u, 0, g, span).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn an_arena_refuses_what_does_not_fit() {
        let g = 2 << 20;
        assert!(plan(Used::default(), 64 << 20, g, 64 << 20).is_some());
        assert!(plan(Used::default(), (64 << 20) + 1, g, 64 << 20).is_none());
        let used = Used {
            top: (64 << 20) - 8,
            mapped: 64 << 20,
        };
        assert!(plan(used, 16, g, 64 << 20).is_none());
        assert!(plan(used, u64::MAX, g, 64 << 20).is_none());
    }
}
