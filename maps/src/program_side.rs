//! The program side of a map: what helpers do, on raw pointers, without allocating.

use super::*;

impl Map {
    /// The id of the inner map at `key`, if any.
    ///
    /// # Safety
    /// `key` must point to `key_size` readable bytes.
    pub(super) unsafe fn inner_id(&self, key: *const u8) -> Option<u32> {
        match self.kind {
            Kind::MapArray => {
                // SAFETY: caller obligation: a 4-byte key.
                let idx = unsafe { std::ptr::read_unaligned(key.cast::<u32>()) };
                array::id_at(self, idx)
            }
            Kind::MapHash => {
                // SAFETY: forwarded caller obligation.
                let v = unsafe { hash::find_value(self, key) };
                // SAFETY: values of a hash of maps are 4-byte ids, 8-byte aligned.
                (!v.is_null()).then(|| unsafe { std::ptr::read_volatile(v.cast::<u32>()) })
            }
            _ => None,
        }
    }

    /// This process's handle on inner map `id`, opened on first use.
    pub(super) fn inner_handle(&self, id: u32) -> Option<Arc<Map>> {
        if let Some(m) = self.inner_maps.get(id) {
            return Some(m);
        }
        let m = match Map::open_in(&self.dir, id) {
            Ok(m) => Arc::new(m),
            Err(e) => {
                tracing::warn!(outer = self.id, inner = id, "cannot open inner map: {e}");
                return None;
            }
        };
        Some(self.inner_maps.get_or_insert(id, m))
    }

    // ----- program side -----

    /// `bpf_map_lookup_elem` from a program: a pointer into the map, or null.
    ///
    /// # Safety
    /// `key` must point to `key_size` readable bytes.
    pub unsafe fn prog_lookup(&self, key: *const u8) -> *mut u8 {
        match self.kind {
            // SAFETY: forwarded caller obligation.
            Kind::Array { percpu } => unsafe { array::prog_lookup(self, key, percpu) },
            // SAFETY: forwarded caller obligation.
            Kind::Hash { lpm: true, .. } => unsafe { lpm::prog_lookup(self, key) },
            Kind::Hash { percpu, .. } => {
                // SAFETY: forwarded caller obligation.
                let v = unsafe { hash::find_value(self, key) };
                if v.is_null() || !percpu {
                    v
                } else {
                    let cpu = current_cpu(self.fixed.ncpus);
                    // SAFETY: per-CPU values hold ncpus slots.
                    unsafe { v.add(cpu * round8(self.value_size())) }
                }
            }
            Kind::MapArray | Kind::MapHash => {
                // SAFETY: forwarded caller obligation.
                let id = unsafe { self.inner_id(key) };
                id.and_then(|id| self.inner_handle(id))
                    .map_or(std::ptr::null_mut(), |m| Arc::as_ptr(&m) as *mut u8)
            }
            // A per-thread array's values are GPU threads'; a CPU program is none of
            // them, and finds nothing (its updates fail: EINVAL below).
            Kind::ThreadArray => std::ptr::null_mut(),
            _ => std::ptr::null_mut(),
        }
    }

    /// `bpf_map_update_elem` from a program.
    ///
    /// # Safety
    /// `key` and `value` must point to `key_size` and `value_size` readable bytes.
    pub unsafe fn prog_update(&self, key: *const u8, value: *const u8, flags: u64) -> i64 {
        let r = match self.kind {
            Kind::Array { percpu } => {
                // SAFETY: forwarded caller obligation.
                let k = unsafe { std::slice::from_raw_parts(key, self.key_size() as usize) };
                array::prog_update(self, k, value, flags, percpu)
            }
            Kind::Hash { lpm: true, .. } => lpm::update(
                self,
                // SAFETY: forwarded caller obligation.
                unsafe { std::slice::from_raw_parts(key, self.key_size() as usize) },
                value,
                flags,
                false,
            ),
            // SAFETY: forwarded caller obligation.
            Kind::Hash { .. } => hash::update(
                self,
                unsafe { std::slice::from_raw_parts(key, self.key_size() as usize) },
                value,
                flags,
                false,
            ),
            Kind::Queue | Kind::Stack => queue::push(self, value, flags),
            _ => Err(err(libc::EINVAL, "not updatable from a program")),
        };
        errno_result(r)
    }

    /// `bpf_map_delete_elem` from a program.
    ///
    /// # Safety
    /// `key` must point to `key_size` readable bytes.
    pub unsafe fn prog_delete(&self, key: *const u8) -> i64 {
        errno_result(match self.kind {
            Kind::Hash { lpm: true, .. } => lpm::delete(
                self,
                // SAFETY: forwarded caller obligation.
                unsafe { std::slice::from_raw_parts(key, self.key_size() as usize) },
            ),
            Kind::Hash { .. } => hash::delete(self, key),
            Kind::Array { .. } => Err(err(libc::EINVAL, "array")),
            _ => Err(err(libc::EINVAL, "not deletable")),
        })
    }

    /// `bpf_task_storage_get`: the value of `task` (a token of
    /// [`current_task`](crate::helpers)), created when `flags` asks; null otherwise.
    ///
    /// # Safety
    /// `task` is null or a task token; `init` is null or points to `value_size`
    /// readable bytes.
    pub unsafe fn prog_task_storage_get(&self, task: u64, init: *const u8, flags: u64) -> *mut u8 {
        if self.kind != Kind::LocalStorage(local_storage::Owner::Task) {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded caller obligation.
        unsafe { local_storage::prog_get(self, task as *const _, init, flags) }
    }

    /// `bpf_task_storage_delete`.
    ///
    /// # Safety
    /// `task` is null or a task token.
    pub unsafe fn prog_task_storage_delete(&self, task: u64) -> i64 {
        if self.kind != Kind::LocalStorage(local_storage::Owner::Task) {
            return -(libc::EINVAL as i64);
        }
        // SAFETY: forwarded caller obligation.
        errno_result(unsafe { local_storage::prog_delete(self, task as *const _) })
    }

    /// `bpf_map_push_elem`.
    ///
    /// # Safety
    /// `value` must point to `value_size` readable bytes.
    pub unsafe fn prog_push(&self, value: *const u8, flags: u64) -> i64 {
        errno_result(match self.kind {
            Kind::Queue | Kind::Stack => queue::push(self, value, flags),
            Kind::Bloom => {
                // SAFETY: forwarded caller obligation.
                let v = unsafe { std::slice::from_raw_parts(value, self.value_size() as usize) };
                bloom::push(self, v, flags)
            }
            _ => Err(err(libc::EINVAL, "not a queue or stack")),
        })
    }

    /// `bpf_map_pop_elem` (`delete` true) and `bpf_map_peek_elem`.
    ///
    /// # Safety
    /// `value` must point to `value_size` writable bytes.
    pub unsafe fn prog_pop(&self, value: *mut u8, delete: bool) -> i64 {
        errno_result(match self.kind {
            Kind::Queue | Kind::Stack if delete => queue::pop(self, value),
            Kind::Queue | Kind::Stack => {
                // SAFETY: forwarded caller obligation.
                let v =
                    unsafe { std::slice::from_raw_parts_mut(value, self.value_size() as usize) };
                queue::peek(self, v)
            }
            // A bloom filter's peek reads the value it tests (the kernel's too).
            Kind::Bloom if !delete => {
                // SAFETY: forwarded caller obligation.
                let v = unsafe { std::slice::from_raw_parts(value, self.value_size() as usize) };
                bloom::peek(self, v)
            }
            _ => Err(err(libc::EINVAL, "not a queue or stack")),
        })
    }
}
