//! The `bpf()` side of a map: keys and values copied in and out the way the kernel's
//! system call does, with its errnos.

use super::*;

impl Map {
    pub(super) fn check_key(&self, key: &[u8]) -> Result<()> {
        if key.len() != self.key_size() as usize {
            return Err(err(libc::EINVAL, "key size mismatch"));
        }
        Ok(())
    }

    pub(super) fn check_syscall_write(&self) -> Result<()> {
        if self.map_flags() & map_flags::RDONLY != 0 || self.is_frozen() {
            return Err(err(libc::EPERM, "map is read-only from user space"));
        }
        Ok(())
    }

    pub(super) fn check_syscall_read(&self) -> Result<()> {
        if self.map_flags() & map_flags::WRONLY != 0 {
            return Err(err(libc::EPERM, "map is write-only from user space"));
        }
        Ok(())
    }

    /// The keys that hold something, in order, for the maps whose `next_key` walks every
    /// possible key: for an array (per-CPU or not), the indexes whose value is not all
    /// zero on any CPU; for a stack trace map, the ids of the stacks it holds. The time
    /// this takes follows what was written to the map, not `max_entries`: the map's file
    /// is sparse and only its written ranges are read. `None` for other maps, whose
    /// `next_key` visits only what they hold.
    pub fn present_keys(&self) -> Result<Option<Vec<u32>>> {
        let keys = match self.kind {
            Kind::Array { percpu } => {
                let copies = if percpu {
                    self.header().ncpus as usize
                } else {
                    1
                };
                let slot_len = round8(self.value_size()) * copies;
                array::slots_with_data(self, slot_len, self.max_entries(), |k, part| {
                    array::nonzero(self, k, part)
                })?
            }
            Kind::ThreadArray => {
                let slot_len = round8(self.value_size()) * self.value_copies();
                array::slots_with_data(self, slot_len, self.max_entries(), |k, part| {
                    array::nonzero(self, k, part)
                })?
            }
            Kind::StackTrace => {
                let slot_len = stack_trace::slot_size(self.value_size());
                // A slot is in use when the word at its start says so; a slot that
                // starts in a hole was never written.
                array::slots_with_data(self, slot_len, self.header().nbuckets, |k, part| {
                    part.start == 0 && stack_trace::is_used(self, k)
                })?
            }
            _ => return Ok(None),
        };
        Ok(Some(keys))
    }

    /// `BPF_MAP_LOOKUP_ELEM`.
    pub fn lookup(&self, key: &[u8], value: &mut [u8]) -> Result<()> {
        self.check_syscall_read()?;
        match self.kind {
            Kind::Array { .. } => array::lookup(self, key, value),
            Kind::ThreadArray => thread_array::lookup(self, key, value),
            Kind::IdArray => Err(err(
                libc::EOPNOTSUPP,
                "prog_array and perf_event_array values are read through their ids",
            )),
            Kind::Hash { lpm: true, .. } => lpm::lookup(self, key, value),
            Kind::Hash { .. } => hash::lookup(self, key, value),
            Kind::Queue | Kind::Stack => queue::peek(self, value),
            Kind::Bloom => bloom::peek(self, value),
            Kind::Ringbuf => Err(err(ENOTSUPP, "ring buffers have no elements")),
            Kind::StackTrace => stack_trace::lookup(self, key, value),
            // User space reads an inner map's id.
            Kind::MapArray => {
                let idx = array_index(key)?;
                let id = array::id_at(self, idx).ok_or_else(|| err(libc::ENOENT, "no map"))?;
                value.copy_from_slice(&id.to_ne_bytes());
                Ok(())
            }
            Kind::MapHash => hash::lookup(self, key, value),
            Kind::LocalStorage(o) => local_storage::lookup(self, o, key, value),
            Kind::Inert { .. } => {
                self.check_key(key)?;
                Err(self.inert_lookup_error())
            }
        }
    }

    /// `BPF_MAP_UPDATE_ELEM`.
    pub fn update(&self, key: &[u8], value: &[u8], flags: u64) -> Result<()> {
        self.check_syscall_write()?;
        match self.kind {
            Kind::Array { .. } => array::update(self, key, value, flags),
            Kind::ThreadArray => thread_array::update(self, key, value, flags),
            Kind::IdArray => Err(err(
                libc::EINVAL,
                "prog_array and perf_event_array take file descriptors (use set_id)",
            )),
            Kind::Hash { lpm: true, .. } => lpm::update(self, key, value.as_ptr(), flags, true),
            Kind::Hash { .. } => hash::update(self, key, value.as_ptr(), flags, true),
            Kind::Queue | Kind::Stack => queue::push(self, value.as_ptr(), flags),
            Kind::Bloom => bloom::push(self, value, flags),
            Kind::Ringbuf => Err(err(ENOTSUPP, "ring buffers have no elements")),
            Kind::StackTrace => Err(err(
                libc::EINVAL,
                "stack traces are filed by bpf_get_stackid, not written from user space",
            )),
            Kind::MapArray | Kind::MapHash => Err(err(
                libc::EINVAL,
                "maps of maps take map file descriptors (use set_inner)",
            )),
            Kind::LocalStorage(o) => local_storage::update(self, o, key, value, flags),
            Kind::Inert { .. } => Err(err(
                libc::EOPNOTSUPP,
                format!(
                    "a {} holds sockets, devices or CPUs, which have no meaning in bpftime",
                    type_name(self.map_type())
                ),
            )),
        }
    }

    /// `BPF_MAP_DELETE_ELEM`.
    pub fn delete(&self, key: &[u8]) -> Result<()> {
        self.check_syscall_write()?;
        match self.kind {
            Kind::Array { .. } | Kind::ThreadArray => {
                Err(err(libc::EINVAL, "array elements cannot be deleted"))
            }
            Kind::IdArray => array::clear_id(self, key),
            Kind::Hash { lpm: true, .. } => lpm::delete(self, key),
            Kind::Hash { .. } => hash::delete(self, key.as_ptr()),
            Kind::Queue | Kind::Stack => Err(err(libc::EINVAL, "use pop on queues and stacks")),
            Kind::Bloom => Err(err(libc::EINVAL, "bloom filters forget nothing")),
            Kind::Ringbuf => Err(err(ENOTSUPP, "ring buffers have no elements")),
            Kind::StackTrace => stack_trace::delete(self, key),
            Kind::MapArray => array::clear_id(self, key),
            Kind::MapHash => hash::delete(self, key.as_ptr()),
            Kind::LocalStorage(o) => local_storage::delete(self, o, key),
            Kind::Inert { array: false } => Err(err(libc::ENOENT, "no such key")),
            Kind::Inert { array: true } => {
                let idx = array_index(key)?;
                if idx >= self.max_entries() {
                    // The reuseport array says E2BIG where the others say EINVAL.
                    let errno = if self.map_type() == map_type::REUSEPORT_SOCKARRAY {
                        libc::E2BIG
                    } else {
                        libc::EINVAL
                    };
                    return Err(err(errno, "index out of range"));
                }
                match self.map_type() {
                    map_type::SOCKMAP => Err(err(libc::EINVAL, "no socket at this index")),
                    map_type::REUSEPORT_SOCKARRAY => Err(err(libc::ENOENT, "no socket")),
                    _ => Ok(()),
                }
            }
        }
    }

    /// `BPF_MAP_GET_NEXT_KEY`; `key` None (or a missing key) gives the first key.
    pub fn next_key(&self, key: Option<&[u8]>, out: &mut [u8]) -> Result<()> {
        if let Some(k) = key {
            self.check_key(k)?;
        }
        if out.len() != self.key_size() as usize {
            return Err(err(libc::EINVAL, "key size mismatch"));
        }
        match self.kind {
            Kind::Array { .. } | Kind::ThreadArray | Kind::IdArray | Kind::MapArray => {
                array::next_key(self, key, out)
            }
            Kind::Hash { lpm: true, .. } => lpm::next_key(self, key, out),
            Kind::Hash { .. } | Kind::MapHash => hash::next_key(self, key, out),
            Kind::Queue | Kind::Stack => Err(err(libc::EINVAL, "queues and stacks have no keys")),
            Kind::Bloom => Err(err(libc::EOPNOTSUPP, "bloom filters have no keys")),
            Kind::Ringbuf => Err(err(ENOTSUPP, "ring buffers have no keys")),
            Kind::StackTrace => stack_trace::next_key(self, key, out),
            Kind::LocalStorage(_) => Err(err(ENOTSUPP, "local storage cannot be iterated")),
            Kind::Inert { array: true } => array::next_key(self, key, out),
            Kind::Inert { array: false } => Err(err(libc::ENOENT, "no more keys")),
        }
    }

    /// `BPF_MAP_LOOKUP_AND_DELETE_ELEM` (a pop for queues and stacks).
    pub fn lookup_and_delete(&self, key: &[u8], value: &mut [u8]) -> Result<()> {
        self.check_syscall_read()?;
        self.check_syscall_write()?;
        match self.kind {
            Kind::Hash { lpm: true, .. } => Err(err(
                ENOTSUPP,
                "lookup-and-delete works on hash maps, queues, stacks and stack trace maps",
            )),
            Kind::Hash { .. } => hash::lookup_and_delete(self, key, value),
            Kind::Queue | Kind::Stack => queue::pop(self, value.as_mut_ptr()),
            Kind::StackTrace => stack_trace::lookup_and_delete(self, key, value),
            _ => Err(err(
                ENOTSUPP,
                "lookup-and-delete works on hash maps, queues, stacks and stack trace maps",
            )),
        }
    }

    /// `BPF_MAP_FREEZE`: user space may no longer write.
    pub fn freeze(&self) -> Result<()> {
        if self
            .header()
            .frozen
            .swap(1, std::sync::atomic::Ordering::AcqRel)
            != 0
        {
            return Err(err(libc::EBUSY, "map is already frozen"));
        }
        Ok(())
    }

    /// Stores an object id (a program, or a BPF output perf event) at `index`
    /// of a prog_array or perf_event_array.
    pub fn set_id(&self, key: &[u8], id: u32, flags: u64) -> Result<()> {
        if self.kind != Kind::IdArray {
            return Err(err(libc::EINVAL, "not a prog_array or perf_event_array"));
        }
        self.check_syscall_write()?;
        array::set_id(self, key, id, flags)
    }

    /// The object id stored at `index` of a prog_array or perf_event_array.
    pub fn id_at(&self, index: u32) -> Option<u32> {
        if self.kind != Kind::IdArray {
            return None;
        }
        array::id_at(self, index)
    }

    /// Where an array map (per-CPU or not) keeps its values, for a JIT that inlines
    /// lookups and updates, exactly where [`prog_lookup`](Self::prog_lookup) points.
    pub fn array_values(&self) -> Option<ArrayValues> {
        let Kind::Array { percpu } = self.kind else {
            return None;
        };
        let stride = round8(self.value_size()) as u32;
        let cpus = self.fixed.ncpus;
        Some(ArrayValues {
            base: self.data(),
            key_stride: if percpu { stride * cpus } else { stride },
            value_size: self.value_size(),
            per_cpu: percpu.then_some((cpus, stride)),
        })
    }

    /// Where a per-thread array keeps its values: key `k`'s value of GPU thread `t` at
    /// `base + k * key_stride + t * per_cpu.1` for `t < per_cpu.0` (here the copies are
    /// threads', not CPUs'), for as long as the map handle lives. `None` for other maps.
    pub fn thread_values(&self) -> Option<ArrayValues> {
        if self.kind != Kind::ThreadArray {
            return None;
        }
        let stride = round8(self.value_size()) as u32;
        let threads = self.fixed.nelems;
        Some(ArrayValues {
            base: self.data(),
            key_stride: stride * threads,
            value_size: self.value_size(),
            per_cpu: Some((threads, stride)),
        })
    }

    /// Runs `f` on `key`'s values in a per-CPU hash map, under the map's lock (no delete
    /// or reuse of the element comes between), first inserting the key with every CPU's
    /// value zeroed when it is missing and `create` is set. Returns what `f` returned and
    /// whether the key was inserted. This is how GPU attach adds what the GPU's SMs
    /// changed into the CPUs' values: see [`PerCpuValues::add`].
    pub fn with_percpu_values<R>(
        &self,
        key: &[u8],
        create: bool,
        f: impl FnOnce(&PerCpuValues<'_>) -> R,
    ) -> Result<(R, bool)> {
        if !matches!(
            self.kind,
            Kind::Hash {
                percpu: true,
                lpm: false,
                ..
            }
        ) {
            return Err(err(libc::EINVAL, "not a per-CPU hash map"));
        }
        let cpus = self.fixed.ncpus as usize;
        let stride = round8(self.value_size());
        let value_size = self.value_size() as usize;
        hash::with_values(self, key, create, |base| {
            f(&PerCpuValues {
                base,
                cpus,
                stride,
                value_size,
                _lock: std::marker::PhantomData,
            })
        })
    }

    /// The value area of an array map, as `mmap` of a `BPF_F_MMAPABLE` array exposes it:
    /// (file offset, length).
    pub fn mmapable_region(&self) -> Option<(usize, usize)> {
        match self.kind {
            Kind::Array { percpu: false } if self.map_flags() & map_flags::MMAPABLE != 0 => Some((
                PAGE_SIZE,
                page_round(round8(self.value_size()) * self.max_entries() as usize),
            )),
            _ => None,
        }
    }

    /// Offsets of a ring buffer's consumer page, and of its producer page that
    /// is followed by the data (for `mmap` by a consumer).
    pub fn ringbuf_regions(&self) -> Option<(usize, usize, usize)> {
        (self.kind == Kind::Ringbuf).then_some((
            ringbuf::CONSUMER_OFFSET,
            ringbuf::PRODUCER_OFFSET,
            self.ring_size() as usize,
        ))
    }

    /// Clears the pending wake-up flag of a ring buffer; a consumer calls this
    /// after draining the FIFO, so that a producer's byte written after the clear is
    /// never drained unseen.
    pub fn ringbuf_clear_wakeup(&self) {
        self.header()
            .wakeup_pending
            .store(0, std::sync::atomic::Ordering::SeqCst);
    }

    /// Opens, non-blocking, the FIFO a ring buffer's producers write a byte into to wake
    /// consumers; None for other maps.
    pub fn open_wakeup_fifo(&self) -> Option<Result<File>> {
        (self.kind == Kind::Ringbuf)
            .then(|| bpftime_store::open_fifo(&self.dir, &bpftime_store::map_fifo_name(self.id)))
    }

    /// Maps of maps: the shape every inner map must have.
    pub fn inner_template(&self) -> Option<InnerTemplate> {
        matches!(self.kind, Kind::MapArray | Kind::MapHash).then_some(self.fixed.inner)
    }

    /// What a map offers as the template of a map of maps' inner maps: its shape, or
    /// the kernel's refusal (`EINVAL` for a map of maps, since maps nest one level
    /// deep; `ENOTSUPP` for a prog_array).
    pub fn as_inner_template(&self) -> Result<InnerTemplate> {
        match self.kind {
            Kind::MapArray | Kind::MapHash => Err(err(
                libc::EINVAL,
                "a map of maps cannot be an inner map (maps nest one level deep)",
            )),
            _ if self.map_type() == map_type::PROG_ARRAY => {
                Err(err(ENOTSUPP, "a prog_array cannot be an inner map"))
            }
            _ => Ok(InnerTemplate {
                map_type: self.map_type(),
                key_size: self.key_size(),
                value_size: self.value_size(),
                max_entries: self.max_entries(),
                map_flags: self.map_flags(),
                _pad: 0,
            }),
        }
    }

    /// `BPF_MAP_UPDATE_ELEM` on a map of maps, whose value is the file descriptor of
    /// `inner`: the map must have the template's type, key and value sizes and flags,
    /// and for arrays its number of entries too (unless the template has
    /// `BPF_F_INNER_MAP`); the outer map then holds its id.
    pub fn set_inner(&self, key: &[u8], inner: &Map, flags: u64) -> Result<()> {
        let Some(t) = self.inner_template() else {
            return Err(err(libc::EINVAL, "not a map of maps"));
        };
        self.check_syscall_write()?;
        self.check_key(key)?;
        let shape = inner
            .as_inner_template()
            .map_err(|e| err(libc::EINVAL, e.to_string()))?;
        let arrays = matches!(
            map_type::served_as(t.map_type),
            map_type::ARRAY
                | map_type::PERCPU_ARRAY
                | map_type::CGROUP_ARRAY
                | map_type::PERF_EVENT_ARRAY
        );
        let sized = t.map_flags & map_flags::INNER_MAP != 0
            || !arrays
            || shape.max_entries == t.max_entries;
        if (
            shape.map_type,
            shape.key_size,
            shape.value_size,
            shape.map_flags,
        ) != (t.map_type, t.key_size, t.value_size, t.map_flags)
            || !sized
        {
            return Err(err(
                libc::EINVAL,
                format!(
                    "inner map {} (type {}, key {}, value {}, max_entries {}, flags {:#x}) does not match the template (type {}, key {}, value {}, max_entries {}, flags {:#x})",
                    inner.id(), shape.map_type, shape.key_size, shape.value_size, shape.max_entries, shape.map_flags,
                    t.map_type, t.key_size, t.value_size, t.max_entries, t.map_flags
                ),
            ));
        }
        let id = inner.id().to_ne_bytes();
        match self.kind {
            Kind::MapArray => array::set_id(self, key, inner.id(), flags),
            _ => hash::update(self, key, id.as_ptr(), flags, true),
        }
    }
}
