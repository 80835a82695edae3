//! Which programs are GPU probes, and on which CUDA kernel: the one reading of
//! section names that the shim (libbpf's `cuda:` handler), `bpftime run` and
//! `bpftime verify` share.
//!
//! Two spellings exist. Ours, `SEC("cuda:KERNEL")` (entry) or
//! `SEC("cuda:KERNEL:entry|exit|launch|ldst|ldst.shared")`, where KERNEL is a mangled name, a
//! demangled one (`ns::kern`, whose `::` is why the kind is only the last
//! word, and only when it is one of the kind words) or a glob (`*gemm*`). And
//! bpftime's original convention: a program named `cuda__*` in
//! `SEC("kprobe/KERNEL")` or `SEC("kretprobe/KERNEL")` probes the entry or the
//! exit of a CUDA kernel, and one in `SEC("kprobe/__memcapture")` every global
//! load and store of every kernel (global memory only: shared memory is asked for with
//! `:ldst.shared`).

use thiserror::Error;

/// The prefix of our own GPU attach points in section names.
pub const CUDA_SECTION_PREFIX: &str = "cuda:";
/// The program-name prefix that makes a kprobe or kretprobe program a GPU probe.
pub const CUDA_PROGRAM_PREFIX: &str = "cuda__";
/// The CUDA "kernel" whose kprobe means the loads and stores of every kernel
/// (bpftime's convention).
pub const MEMCAPTURE: &str = "__memcapture";

/// Bit of a kprobe perf event's `config` that bpftime reserves for launch
/// events: a CPU-side program run at each launch of the kernel named in
/// `config1`. No kernel PMU defines it (the kprobe PMU uses bit 0 for
/// retprobes), so a tool never sets it by accident.
pub const GPU_LAUNCH_CONFIG_BIT: u32 = 63;

/// Bit of a kprobe perf event's `config` that bpftime reserves for memory-access
/// probes: a GPU program run at every global load and store of the kernels named
/// in `config1`.
pub const GPU_ACCESS_CONFIG_BIT: u32 = 62;

/// Bit of a kprobe perf event's `config` that, beside [`GPU_ACCESS_CONFIG_BIT`], makes a
/// memory-access probe see shared-memory accesses too (`cuda:KERNEL:ldst.shared`).
pub const GPU_SHARED_ACCESS_CONFIG_BIT: u32 = 61;

/// Where in a CUDA kernel's life a program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuProbeKind {
    /// On the GPU, in every thread, as the kernel starts.
    Entry,
    /// On the GPU, in every thread, as the kernel returns.
    Exit,
    /// On the CPU, once per launch of the kernel.
    Launch,
    /// On the GPU, at every global load, store, atomic and reduction.
    Access,
    /// On the GPU, at those and every shared-memory one.
    SharedAccess,
}

impl GpuProbeKind {
    /// The kind as `bpftime list` and `bpftime run` show it.
    pub fn label(self) -> &'static str {
        match self {
            GpuProbeKind::Entry => "gpu-entry",
            GpuProbeKind::Exit => "gpu-exit",
            GpuProbeKind::Launch => "gpu-launch",
            GpuProbeKind::Access => "gpu-ldst",
            GpuProbeKind::SharedAccess => "gpu-ldst.shared",
        }
    }

    /// The `config` of the kprobe perf event that attaches such a program, for the kinds
    /// that are bpftime's own events (launches and memory accesses); `None` for entry and
    /// exit, which are plain kprobes and kretprobes.
    pub fn event_config(self) -> Option<u64> {
        match self {
            GpuProbeKind::Entry | GpuProbeKind::Exit => None,
            GpuProbeKind::Launch => Some(1 << GPU_LAUNCH_CONFIG_BIT),
            GpuProbeKind::Access => Some(1 << GPU_ACCESS_CONFIG_BIT),
            GpuProbeKind::SharedAccess => {
                Some(1 << GPU_ACCESS_CONFIG_BIT | 1 << GPU_SHARED_ACCESS_CONFIG_BIT)
            }
        }
    }

    /// Whether the program runs on the GPU (and so must pass the GPU rules).
    pub fn on_gpu(self) -> bool {
        !matches!(self, GpuProbeKind::Launch)
    }
}

/// Where a GPU program attaches, as its section names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuAttachPoint {
    pub kind: GpuProbeKind,
    /// The kernel name pattern: mangled, demangled, or a glob.
    pub kernel: String,
}

/// A section that is a GPU probe but not one bpftime can attach.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GpuSectionError {
    #[error("SEC(\"{section}\") names no CUDA kernel; write SEC(\"cuda:KERNEL\") or SEC(\"cuda:KERNEL:entry|exit|launch|ldst|ldst.shared\")")]
    NoKernel { section: String },
}

/// Reads a `cuda:` section name; `None` when `section` is not one.
pub fn parse_cuda_section(section: &str) -> Option<Result<GpuAttachPoint, GpuSectionError>> {
    let rest = section.strip_prefix(CUDA_SECTION_PREFIX)?;
    let (kernel, word) = match rest.rsplit_once(':') {
        // `ns::kern` splits into `ns:` and `kern`: a word after `::` is part
        // of the name, not a kind.
        Some((k, w)) if !k.ends_with(':') => (k, Some(w)),
        _ => (rest, None),
    };
    let (kind, kernel) = match word {
        Some("entry") => (GpuProbeKind::Entry, kernel),
        Some("exit") => (GpuProbeKind::Exit, kernel),
        Some("launch") => (GpuProbeKind::Launch, kernel),
        Some("ldst") => (GpuProbeKind::Access, kernel),
        Some("ldst.shared") => (GpuProbeKind::SharedAccess, kernel),
        _ => (GpuProbeKind::Entry, rest),
    };
    if kernel.is_empty() {
        return Some(Err(GpuSectionError::NoKernel {
            section: section.to_string(),
        }));
    }
    Some(Ok(GpuAttachPoint {
        kind,
        kernel: kernel.to_string(),
    }))
}

/// The GPU probe that program `prog` in `section` is, if it is one: a `cuda:`
/// section, or a `cuda__*` program in `kprobe/KERNEL` or `kretprobe/KERNEL`.
pub fn gpu_probe(prog: &str, section: &str) -> Option<Result<GpuAttachPoint, GpuSectionError>> {
    if let Some(r) = parse_cuda_section(section) {
        return Some(r);
    }
    if !prog.starts_with(CUDA_PROGRAM_PREFIX) {
        return None;
    }
    let (kind, kernel) = match section.split_once('/') {
        Some(("kprobe", k)) => (GpuProbeKind::Entry, k),
        Some(("kretprobe", k)) => (GpuProbeKind::Exit, k),
        _ if matches!(section, "kprobe" | "kretprobe") => (GpuProbeKind::Entry, ""),
        _ => return None,
    };
    Some(if kernel.is_empty() {
        Err(GpuSectionError::NoKernel {
            section: section.to_string(),
        })
    } else if kernel == MEMCAPTURE && kind == GpuProbeKind::Entry {
        Ok(GpuAttachPoint {
            kind: GpuProbeKind::Access,
            kernel: "*".to_string(),
        })
    } else {
        Ok(GpuAttachPoint {
            kind,
            kernel: kernel.to_string(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::LinkKind;

    fn probe(kind: GpuProbeKind, kernel: &str) -> Option<Result<GpuAttachPoint, GpuSectionError>> {
        Some(Ok(GpuAttachPoint {
            kind,
            kernel: kernel.to_string(),
        }))
    }

    #[test]
    fn cuda_sections_name_kernel_and_kind() {
        use GpuProbeKind::*;
        assert_eq!(
            parse_cuda_section("cuda:vectorAdd"),
            probe(Entry, "vectorAdd")
        );
        assert_eq!(
            parse_cuda_section("cuda:vectorAdd:entry"),
            probe(Entry, "vectorAdd")
        );
        assert_eq!(
            parse_cuda_section("cuda:vectorAdd:exit"),
            probe(Exit, "vectorAdd")
        );
        assert_eq!(
            parse_cuda_section("cuda:vectorAdd:launch"),
            probe(Launch, "vectorAdd")
        );
        assert_eq!(
            parse_cuda_section("cuda:_Z9vectorAddPKfS0_Pfi"),
            probe(Entry, "_Z9vectorAddPKfS0_Pfi")
        );
        assert_eq!(parse_cuda_section("kprobe/vectorAdd"), None);
        assert_eq!(parse_cuda_section("uprobe/cuda:x"), None);
    }

    #[test]
    fn demangled_names_keep_their_colons() {
        use GpuProbeKind::*;
        assert_eq!(
            parse_cuda_section("cuda:ns::kern:exit"),
            probe(Exit, "ns::kern")
        );
        assert_eq!(
            parse_cuda_section("cuda:ns::kern"),
            probe(Entry, "ns::kern")
        );
        // `exit` after `::` is a function called exit, not a kind.
        assert_eq!(
            parse_cuda_section("cuda:ns::exit"),
            probe(Entry, "ns::exit")
        );
        assert_eq!(
            parse_cuda_section("cuda:a::b::launch:launch"),
            probe(Launch, "a::b::launch")
        );
        // A last word that is not a kind is part of the name.
        assert_eq!(
            parse_cuda_section("cuda:void kern<int>(int):entry"),
            probe(Entry, "void kern<int>(int)")
        );
        assert_eq!(parse_cuda_section("cuda:a:b"), probe(Entry, "a:b"));
    }

    #[test]
    fn globs_are_kernel_patterns() {
        use GpuProbeKind::*;
        assert_eq!(parse_cuda_section("cuda:*gemm*"), probe(Entry, "*gemm*"));
        assert_eq!(
            parse_cuda_section("cuda:*gemm*:launch"),
            probe(Launch, "*gemm*")
        );
        assert_eq!(
            parse_cuda_section("cuda:cutlass::*:exit"),
            probe(Exit, "cutlass::*")
        );
    }

    #[test]
    fn memory_access_probes_name_kernels_and_empty_names_are_errors() {
        use GpuProbeKind::*;
        assert_eq!(
            parse_cuda_section("cuda:vectorAdd:ldst"),
            probe(Access, "vectorAdd")
        );
        assert_eq!(
            parse_cuda_section("cuda:ns::ldst:ldst"),
            probe(Access, "ns::ldst")
        );
        assert_eq!(
            parse_cuda_section("cuda:matmul:ldst.shared"),
            probe(SharedAccess, "matmul")
        );
        assert_eq!(
            parse_cuda_section("cuda:*gemm*:ldst.shared"),
            probe(SharedAccess, "*gemm*")
        );
        assert_eq!(
            parse_cuda_section("cuda:ns::ldst.shared:ldst.shared"),
            probe(SharedAccess, "ns::ldst.shared")
        );
        // After `::` it is a name; other spaces are no kind (they are not probed).
        assert_eq!(
            parse_cuda_section("cuda:ns::ldst.shared"),
            probe(Entry, "ns::ldst.shared")
        );
        assert_eq!(
            parse_cuda_section("cuda:k:ldst.local"),
            probe(Entry, "k:ldst.local")
        );
        for s in ["cuda:", "cuda::exit", "cuda::launch", "cuda::ldst.shared"] {
            assert!(
                matches!(
                    parse_cuda_section(s),
                    Some(Err(GpuSectionError::NoKernel { .. }))
                ),
                "{s}"
            );
        }
    }

    #[test]
    fn cuda_named_kprobes_are_gpu_probes() {
        use GpuProbeKind::*;
        assert_eq!(
            gpu_probe("cuda__count", "kprobe/vectorAdd"),
            probe(Entry, "vectorAdd")
        );
        assert_eq!(gpu_probe("cuda__count", "kretprobe/k"), probe(Exit, "k"));
        assert_eq!(
            gpu_probe("count", "cuda:vectorAdd:exit"),
            probe(Exit, "vectorAdd")
        );
        // bpftime's memory capture: every access of every kernel.
        assert_eq!(
            gpu_probe("cuda__mem", "kprobe/__memcapture"),
            probe(Access, "*")
        );
        assert!(matches!(
            gpu_probe("cuda__x", "kprobe"),
            Some(Err(GpuSectionError::NoKernel { .. }))
        ));
        // A kprobe of another name, and a cuda__ program on a uprobe, are not GPU probes
        // by their section (the shim makes every attached kprobe one).
        assert_eq!(gpu_probe("count", "kprobe/do_sys_open"), None);
        assert_eq!(gpu_probe("cuda__count", "uprobe/work"), None);
        assert_eq!(gpu_probe("cuda__count", "kprobe.multi/x"), None);
    }

    #[test]
    fn kinds_say_where_they_run_and_how_they_are_shown() {
        use GpuProbeKind::*;
        // The labels `bpftime list` has always shown for these links.
        let labels: Vec<&str> = [Entry, Exit, Launch, Access, SharedAccess]
            .iter()
            .map(|k| LinkKind::Gpu(*k).label())
            .collect();
        assert_eq!(
            labels,
            [
                "gpu-entry",
                "gpu-exit",
                "gpu-launch",
                "gpu-ldst",
                "gpu-ldst.shared"
            ]
        );
        assert!(GpuProbeKind::Access.on_gpu());
        assert!(GpuProbeKind::SharedAccess.on_gpu());
        assert!(!GpuProbeKind::Launch.on_gpu());
        assert!(GpuProbeKind::Exit.on_gpu());
        assert_eq!(GpuProbeKind::Entry.event_config(), None);
        assert_eq!(GpuProbeKind::Access.event_config(), Some(1 << 62));
        assert_eq!(
            GpuProbeKind::SharedAccess.event_config(),
            Some(1 << 62 | 1 << 61)
        );
    }
}
