//! Which ELF object the process maps holds the PTX of a kernel, for `bpftime attach PID`
//! into a CUDA process whose modules were loaded before GPU attach started (the driver was
//! handed their images before its entry points were intercepted). The objects' fatbins
//! are read by `bpftime_gpu_ptx::elf_fatbins`; [`FatbinIndex`] keeps what each object
//! holds, so each is read once however many kernels are looked up.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use bpftime_attach::ProcMapping;
use bpftime_gpu_ptx::elf_fatbins::{
    read_container, scan_object, Container, ObjectFatbins, ScanError,
};
use bpftime_gpu_ptx::fatbin::ModulePtx;
use thiserror::Error;

/// An object the process maps, as its mappings name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MappedObject {
    pub path: PathBuf,
    /// Device and inode: a file replaced under the same path is another object.
    pub dev: (u32, u32),
    pub inode: u64,
}

/// The distinct files mapped in `maps`, in the order they first appear (the executable
/// first, as the kernel maps it first). Anonymous and special mappings, devices, and files
/// deleted since they were mapped are left out.
pub fn mapped_objects(maps: &[ProcMapping]) -> Vec<MappedObject> {
    let mut seen = HashSet::new();
    maps.iter()
        .filter(|m| m.inode != 0 && !m.path.ends_with(" (deleted)"))
        .filter_map(|m| {
            let path = m.file_path()?;
            if path.starts_with("/dev/") || path.starts_with("/memfd:") {
                return None;
            }
            Some(MappedObject {
                path: path.to_path_buf(),
                dev: m.dev,
                inode: m.inode,
            })
        })
        .filter(|o| seen.insert(o.clone()))
        .collect()
}

/// Why [`FatbinIndex::ptx_of`] has no PTX for a kernel, as the end of a sentence.
#[derive(Debug, Error)]
pub enum Missing {
    #[error(
        "no object it maps holds PTX with it for sm_{sm}: a module loaded from memory \
         (start the program under bpftime to have the load seen), or one built without PTX \
         (nvcc -gencode arch=compute_XX,code=compute_XX adds it)"
    )]
    NoPtx { sm: u32 },
    #[error(
        "the PTX with a kernel of that name in {} is another module's (its kernels are not \
         those of the module launched)",
        object.display()
    )]
    OtherModule { object: PathBuf },
    #[error(
        "{} objects hold different PTX with a kernel of that name ({}): which one its module \
         came from is unknown",
        objects.len(),
        objects.iter().map(|o| o.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    Ambiguous { objects: Vec<PathBuf> },
    #[error("its PTX is unreadable: {0}")]
    Unreadable(ScanError),
}

/// A container that holds a kernel, and the object it is in.
#[derive(Debug, Clone)]
pub struct Found {
    pub object: Arc<ObjectFatbins>,
    pub container: Container,
}

/// The fatbins of a process's mapped objects for one device architecture, each object
/// scanned once, at the first lookup after it appeared.
#[derive(Debug)]
pub struct FatbinIndex {
    sm: u32,
    /// Objects in the order they were found; `None` for one that is not an ELF object or
    /// could not be read (kept so that it is not tried again).
    objects: Vec<(MappedObject, Option<Arc<ObjectFatbins>>)>,
}

impl FatbinIndex {
    pub fn new(sm: u32) -> FatbinIndex {
        FatbinIndex {
            sm,
            objects: Vec::new(),
        }
    }

    /// Scans the objects of `objects` not scanned yet.
    pub fn update(&mut self, objects: &[MappedObject]) {
        for o in objects {
            if self.objects.iter().any(|(known, _)| known == o) {
                continue;
            }
            let started = std::time::Instant::now();
            let scanned = match scan_object(&o.path, self.sm) {
                Ok(f) => {
                    if !f.containers.is_empty() || !f.unreadable.is_empty() {
                        tracing::debug!(
                            object = %o.path.display(),
                            with_ptx = f.containers.len(),
                            without_ptx = f.without_ptx,
                            unreadable = ?f.unreadable,
                            ms = started.elapsed().as_secs_f64() * 1e3,
                            "fatbins scanned"
                        );
                    }
                    Some(Arc::new(f))
                }
                Err(e) => {
                    tracing::trace!("not scanned for fatbins: {e}");
                    None
                }
            };
            self.objects.push((o.clone(), scanned));
        }
    }

    /// Scans what this process maps now ([`FatbinIndex::update`] on `/proc/self/maps`).
    pub fn update_from_self(&mut self) -> Result<(), ScanError> {
        let text =
            std::fs::read_to_string("/proc/self/maps").map_err(|source| ScanError::Read {
                path: "/proc/self/maps".into(),
                source,
            })?;
        self.update(&mapped_objects(&bpftime_attach::parse_proc_maps(&text)));
        Ok(())
    }

    /// Every container, in every object scanned, whose PTX defines kernel `name` (the
    /// mangled name, as the PTX spells it).
    pub fn find(&self, name: &str) -> Vec<Found> {
        self.objects
            .iter()
            .filter_map(|(_, o)| o.as_ref())
            .flat_map(|o| {
                o.containers
                    .iter()
                    .filter(|c| c.has_kernel(name))
                    .map(|c| Found {
                        object: o.clone(),
                        container: c.clone(),
                    })
            })
            .collect()
    }

    /// The PTX of the module that kernel `name` was loaded from, and the object it is in:
    /// the one container holding it, or, where several do, the one whose kernels include
    /// every kernel of `module_kernels` (the module's kernels, where the driver lists
    /// them), or several identical ones (a file and its copy).
    pub fn ptx_of(
        &self,
        name: &str,
        module_kernels: Option<&[String]>,
    ) -> Result<(ModulePtx, PathBuf), Missing> {
        let all = self.find(name);
        let hits: Vec<&Found> = all
            .iter()
            .filter(|h| {
                module_kernels.is_none_or(|ks| ks.iter().all(|k| h.container.has_kernel(k)))
            })
            .collect();
        let read = |h: &Found| {
            read_container(&h.object.path, &h.container).map(|p| (p, h.object.path.clone()))
        };
        match hits.as_slice() {
            [] if all.is_empty() => Err(Missing::NoPtx { sm: self.sm }),
            [] => Err(Missing::OtherModule {
                object: all[0].object.path.clone(),
            }),
            [one] => read(one).map_err(Missing::Unreadable),
            [first, rest @ ..] => {
                let (ptx, path) = read(first).map_err(Missing::Unreadable)?;
                if rest.iter().all(|h| read(h).is_ok_and(|(p, _)| p == ptx)) {
                    Ok((ptx, path))
                } else {
                    Err(Missing::Ambiguous {
                        objects: hits.iter().map(|h| h.object.path.clone()).collect(),
                    })
                }
            }
        }
    }

    /// How many objects were scanned (ELF or not).
    pub fn objects_seen(&self) -> usize {
        self.objects.len()
    }
}
