//! The map commands of `bpf()`: `BPF_MAP_CREATE`, the element commands
//! (`BPF_MAP_LOOKUP_ELEM`, `UPDATE`, `DELETE`, `GET_NEXT_KEY`, `LOOKUP_AND_DELETE`) and
//! the batch ones, with the kernel's errnos.

use crate::attr::{self, write_back_u32, Attr};
use crate::core::{refuse, Object, ObjectRef, Shim, SysResult};
use bpftime_isa::uapi::cmd;
use bpftime_runtime::{Map, MapSpec, ObjectKind};
use std::os::fd::RawFd;
use std::sync::Arc;

impl Shim {
    /// The map behind `fd`, or the kernel's errno: `EINVAL` for an open file that is
    /// not a map, `EBADF` for a closed descriptor.
    pub(crate) fn map_by_fd(&mut self, fd: RawFd) -> SysResult<Arc<Map>> {
        match self.object(fd).map(|o| &o.object) {
            Some(Object::Map(m)) => Ok(m.clone()),
            Some(_) => Err(libc::EINVAL),
            // SAFETY: F_GETFD only asks whether `fd` is open.
            None if unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0 => Err(libc::EINVAL),
            None => Err(libc::EBADF),
        }
    }

    pub(crate) fn map_create(&mut self, a: &Attr) -> SysResult {
        use attr::map_create as f;
        use bpftime_isa::uapi::map_type as mt;
        let map_type = a.u32(f::MAP_TYPE);
        let inner = if matches!(map_type, mt::ARRAY_OF_MAPS | mt::HASH_OF_MAPS) {
            let fd = a.u32(f::INNER_MAP_FD) as RawFd;
            let template = self.map_by_fd(fd).map_err(|errno| {
                refuse(
                    errno,
                    format_args!("BPF_MAP_CREATE: inner_map_fd {fd} of a map of maps is not a map"),
                )
            })?;
            Some(
                template
                    .as_inner_template()
                    .map_err(|e| refuse(e.errno(), format_args!("BPF_MAP_CREATE: {e}")))?,
            )
        } else {
            None
        };
        let spec = MapSpec {
            inner,
            map_type: a.u32(f::MAP_TYPE),
            key_size: a.u32(f::KEY_SIZE),
            value_size: a.u32(f::VALUE_SIZE),
            max_entries: a.u32(f::MAX_ENTRIES),
            map_flags: a.u32(f::MAP_FLAGS),
            name: a.str(f::NAME, 16),
            btf_id: match self.object(a.u32(f::BTF_FD) as RawFd) {
                Some(ObjectRef {
                    object: Object::Btf { id, .. },
                    ..
                }) if a.u32(f::BTF_FD) != 0 => *id,
                _ => 0,
            },
            btf_key_type_id: a.u32(f::BTF_KEY_TYPE_ID),
            btf_value_type_id: a.u32(f::BTF_VALUE_TYPE_ID),
            map_extra: a.u64(f::MAP_EXTRA),
        };
        if matches!(
            map_type,
            mt::TASK_STORAGE | mt::INODE_STORAGE | mt::SK_STORAGE | mt::CGRP_STORAGE
        ) {
            self.check_storage_btf(a, &spec)?;
        }
        let map = Map::create(self.store(), &spec).map_err(|e| {
            refuse(
                e.errno(),
                format_args!("BPF_MAP_CREATE `{}`: {e}", spec.name),
            )
        })?;
        let id = map.id();
        self.open_fd(ObjectKind::Map, id, Object::Map(Arc::new(map)))
            .map(|fd| fd as i64)
    }

    /// Local storage keeps BTF for its key and value, and the kernel checks both: the
    /// key an `int`, the value of the map's value size (after the checks of the
    /// attributes alone, whose errors come first).
    pub(crate) fn check_storage_btf(&mut self, a: &Attr, spec: &MapSpec) -> SysResult<()> {
        use attr::map_create as f;
        Map::check_spec(spec).map_err(|e| {
            refuse(
                e.errno(),
                format_args!("BPF_MAP_CREATE `{}`: {e}", spec.name),
            )
        })?;
        let fd = a.u32(f::BTF_FD) as RawFd;
        let btf_id = match self.object(fd) {
            Some(ObjectRef {
                object: Object::Btf { id, .. },
                ..
            }) => *id,
            _ => {
                return Err(refuse(
                    libc::EINVAL,
                    format_args!("BPF_MAP_CREATE `{}`: btf_fd {fd} is not BTF", spec.name),
                ))
            }
        };
        let blob = bpftime_runtime::read_btf(self.store(), btf_id).map_err(|e| e.errno())?;
        let key = crate::btf::resolve(&blob, spec.btf_key_type_id);
        let value = crate::btf::resolve(&blob, spec.btf_value_type_id);
        if !key.is_some_and(|k| k.is_i32) || value.map(|v| v.size) != Some(spec.value_size) {
            return Err(refuse(
                libc::EINVAL,
                format_args!(
                    "BPF_MAP_CREATE `{}`: local storage needs an int key type and a value type of {} bytes in its BTF",
                    spec.name, spec.value_size
                ),
            ));
        }
        Ok(())
    }

    /// # Safety
    /// Pointers in `a` must be valid for the map's key and value sizes.
    pub(crate) unsafe fn map_elem(&mut self, command: u32, a: &Attr) -> SysResult {
        use attr::elem as f;
        let m = self.map(a.u32(f::MAP_FD))?;
        let ks = m.key_size() as usize;
        let vs = m.syscall_value_size();
        let key_ptr = a.u64(f::KEY) as *const u8;
        let val_ptr = a.u64(f::VALUE) as *mut u8;
        let flags = a.u64(f::FLAGS);
        let key: Option<&[u8]> = if key_ptr.is_null() {
            None
        } else {
            // SAFETY: caller obligation: the key holds key_size bytes.
            Some(unsafe { std::slice::from_raw_parts(key_ptr, ks) })
        };
        let need_key = || key.ok_or(libc::EFAULT);
        let value = || -> SysResult<&mut [u8]> {
            if val_ptr.is_null() {
                return Err(libc::EFAULT);
            }
            // SAFETY: caller obligation: the value holds syscall_value_size bytes.
            Ok(unsafe { std::slice::from_raw_parts_mut(val_ptr, vs) })
        };
        let e = |r: bpftime_runtime::Result<()>| r.map(|_| 0).map_err(|e| e.errno());
        match command {
            // The kernel has no user-space lookup for a cgroup array (ENOTSUPP).
            cmd::MAP_LOOKUP_ELEM if m.map_type() == bpftime_isa::uapi::map_type::CGROUP_ARRAY => {
                Err(bpftime_runtime::ENOTSUPP)
            }
            cmd::MAP_UPDATE_ELEM if m.map_type() == bpftime_isa::uapi::map_type::CGROUP_ARRAY => {
                let k = need_key()?;
                let fd = i32::from_ne_bytes(value()?[..4].try_into().map_err(|_| libc::EINVAL)?);
                let id = bpftime_runtime::cgroup::id_of_fd(fd)?;
                e(m.set_id(k, id, flags))
            }
            // A map of maps takes inner maps by fd, and gives their ids back (the
            // generic lookup reads the stored id).
            cmd::MAP_UPDATE_ELEM if m.inner_template().is_some() => {
                let k = need_key()?;
                let fd = i32::from_ne_bytes(value()?[..4].try_into().map_err(|_| libc::EINVAL)?);
                let inner = self.map_by_fd(fd)?;
                e(m.set_inner(k, &inner, flags))
            }
            // A GPU ring buffer shown as a perf event array takes perf events by fd, as
            // libbpf's perf buffer API puts them in (see gpu_ring.rs).
            cmd::MAP_UPDATE_ELEM if m.map_type() == bpftime_isa::uapi::map_type::GPU_RINGBUF => {
                let index =
                    u32::from_ne_bytes(need_key()?[..4].try_into().map_err(|_| libc::EINVAL)?);
                let fd = i32::from_ne_bytes(value()?[..4].try_into().map_err(|_| libc::EINVAL)?);
                let event = match self.object(fd).cloned() {
                    Some(ObjectRef {
                        id,
                        object: Object::PerfEvent { .. },
                        ..
                    }) => id,
                    Some(_) => return Err(libc::EINVAL),
                    None => return Err(libc::EBADF),
                };
                self.gpu_ring_add_perf_buffer(&m, index, event)
            }
            cmd::MAP_DELETE_ELEM if m.map_type() == bpftime_isa::uapi::map_type::GPU_RINGBUF => {
                let index =
                    u32::from_ne_bytes(need_key()?[..4].try_into().map_err(|_| libc::EINVAL)?);
                self.gpu_ring_remove_perf_buffer(&m, index)
            }
            cmd::MAP_LOOKUP_ELEM if m.holds_ids() => {
                let k = need_key()?;
                let id = m
                    .id_at(u32::from_ne_bytes(
                        k[..4].try_into().map_err(|_| libc::EINVAL)?,
                    ))
                    .ok_or(libc::ENOENT)?;
                value()?.copy_from_slice(&id.to_ne_bytes());
                Ok(0)
            }
            cmd::MAP_LOOKUP_ELEM => e(m.lookup(key.unwrap_or(&[]), value()?)),
            cmd::MAP_UPDATE_ELEM if m.holds_ids() => {
                let k = need_key()?;
                let fd = u32::from_ne_bytes(value()?[..4].try_into().map_err(|_| libc::EINVAL)?);
                let target = self.object(fd as RawFd).cloned().ok_or(libc::EBADF)?;
                let ok = matches!(
                    (m.map_type(), &target.object),
                    (bpftime_isa::uapi::map_type::PROG_ARRAY, Object::Program(_))
                        | (
                            bpftime_isa::uapi::map_type::PERF_EVENT_ARRAY,
                            Object::PerfEvent { .. }
                        )
                );
                if !ok {
                    return Err(libc::EINVAL);
                }
                e(m.set_id(k, target.id, flags))
            }
            cmd::MAP_UPDATE_ELEM => {
                let v = value()?;
                e(m.update(key.unwrap_or(&[]), v, flags))
            }
            cmd::MAP_DELETE_ELEM => e(m.delete(need_key()?)),
            cmd::MAP_GET_NEXT_KEY => {
                let out_ptr = a.u64(f::VALUE) as *mut u8;
                // Maps without keys (queues, stacks, bloom filters) answer for
                // themselves: the kernel copies no key out of them.
                let out: &mut [u8] = if ks == 0 {
                    &mut []
                } else if out_ptr.is_null() {
                    return Err(libc::EFAULT);
                } else {
                    // SAFETY: caller obligation: next_key holds key_size bytes.
                    unsafe { std::slice::from_raw_parts_mut(out_ptr, ks) }
                };
                e(m.next_key(key, out))
            }
            _ => e(m.lookup_and_delete(key.unwrap_or(&[]), value()?)),
        }
    }

    /// Batch commands. The batch cursor is a u32 count of keys already visited.
    ///
    /// # Safety
    /// Pointers in `a` must be valid for `count` keys and values.
    pub(crate) unsafe fn map_batch(
        &mut self,
        command: u32,
        a: &Attr,
        attr: *mut u8,
        size: usize,
    ) -> SysResult {
        use attr::batch as f;
        let m = self.map(a.u32(f::MAP_FD))?;
        let ks = m.key_size() as usize;
        let vs = m.syscall_value_size();
        let count = a.u32(f::COUNT) as usize;
        let keys = a.u64(f::KEYS) as *mut u8;
        let values = a.u64(f::VALUES) as *mut u8;
        let elem_flags = a.u64(f::ELEM_FLAGS);
        // The kernel's copy from a null array faults (EFAULT); a slice over one is
        // undefined behaviour here.
        let values_used = command != cmd::MAP_DELETE_BATCH;
        if count > 0 && (keys.is_null() || (values_used && values.is_null())) {
            return Err(libc::EFAULT);
        }
        let mut done = 0usize;
        // SAFETY: caller obligation.
        let set_count = |n: usize| unsafe { write_back_u32(attr, size, f::COUNT, n as u32) };
        match command {
            cmd::MAP_UPDATE_BATCH | cmd::MAP_DELETE_BATCH => {
                let mut result = Ok(0);
                while done < count {
                    // SAFETY: keys holds count keys (caller obligation).
                    let k = unsafe { std::slice::from_raw_parts(keys.add(done * ks), ks) };
                    let r = if command == cmd::MAP_UPDATE_BATCH {
                        // SAFETY: values holds count values.
                        let v = unsafe { std::slice::from_raw_parts(values.add(done * vs), vs) };
                        if m.inner_template().is_some() {
                            // Maps of maps take inner maps by fd here too.
                            let fd =
                                i32::from_ne_bytes(v[..4].try_into().map_err(|_| libc::EINVAL)?);
                            self.map_by_fd(fd).and_then(|inner| {
                                m.set_inner(k, &inner, elem_flags).map_err(|e| e.errno())
                            })
                        } else {
                            m.update(k, v, elem_flags).map_err(|e| e.errno())
                        }
                    } else {
                        m.delete(k).map_err(|e| e.errno())
                    };
                    if let Err(errno) = r {
                        result = Err(errno);
                        break;
                    }
                    done += 1;
                }
                set_count(done);
                result
            }
            _ => {
                if count == 0 {
                    return Err(libc::EINVAL);
                }
                let in_batch = a.u64(f::IN_BATCH) as *const u8;
                let out_batch = a.u64(f::OUT_BATCH) as *mut u8;
                if out_batch.is_null() {
                    return Err(libc::EFAULT);
                }
                let skip = if in_batch.is_null() {
                    0
                } else {
                    // SAFETY: the cursor we handed out is a u32.
                    unsafe { std::ptr::read_unaligned(in_batch.cast::<u32>()) as usize }
                };
                let delete = command == cmd::MAP_LOOKUP_AND_DELETE_BATCH;
                // Walk to the cursor, then copy up to `count` elements.
                let mut cur: Option<Vec<u8>> = None;
                let mut visited = 0usize;
                let mut batch: Vec<Vec<u8>> = Vec::new();
                loop {
                    let mut next = vec![0u8; ks];
                    if m.next_key(cur.as_deref(), &mut next).is_err() {
                        break;
                    }
                    if visited >= skip {
                        batch.push(next.clone());
                        if batch.len() == count {
                            cur = Some(next);
                            break;
                        }
                    }
                    visited += 1;
                    cur = Some(next);
                }
                let exhausted = {
                    let mut probe = vec![0u8; ks];
                    batch.len() < count || m.next_key(cur.as_deref(), &mut probe).is_err()
                };
                for k in &batch {
                    // SAFETY: keys/values hold `count` elements; done < count.
                    let (kd, vd) = unsafe {
                        (
                            std::slice::from_raw_parts_mut(keys.add(done * ks), ks),
                            std::slice::from_raw_parts_mut(values.add(done * vs), vs),
                        )
                    };
                    let r = if delete {
                        m.lookup_and_delete(k, vd)
                    } else {
                        m.lookup(k, vd)
                    };
                    if r.is_ok() {
                        kd.copy_from_slice(k);
                        done += 1;
                    }
                }
                let next_cursor = if delete { skip } else { skip + batch.len() } as u32;
                // SAFETY: out_batch holds a u32 cursor.
                unsafe { std::ptr::write_unaligned(out_batch.cast::<u32>(), next_cursor) };
                set_count(done);
                if exhausted {
                    Err(libc::ENOENT)
                } else {
                    Ok(0)
                }
            }
        }
    }
}
