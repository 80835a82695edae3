//! The helpers programs call, as plain `extern "C"` functions of five 64-bit
//! arguments, so the interpreter and the JITs call them the same way.
//!
//! A map argument is the address of a process-local [`Map`]: the loader
//! replaces every map reference in a program by that address before running it.

use bpftime_isa::uapi::helper as id;
use bpftime_maps::{ringbuf_commit, Map};
use bpftime_store::cpu::possible_cpus;
use bpftime_store::cpu_slots::current_cpu;
use bpftime_store::thread::pid_tgid;
use std::cell::Cell;
use std::io::Write;

use std::sync::OnceLock;

pub use bpftime_isa::HelperFn;

/// What the current program invocation was attached with.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProbeContext {
    /// Address of the probed function (`bpf_get_func_ip`).
    pub func_ip: u64,
    /// The link's cookie (`bpf_get_attach_cookie`).
    pub cookie: u64,
}

thread_local! {
    static PROBE: Cell<ProbeContext> = const { Cell::new(ProbeContext { func_ip: 0, cookie: 0 }) };
    static RNG: Cell<u64> = const { Cell::new(0) };
}

/// Sets the context helpers report for programs run next on this thread.
pub fn set_probe_context(ctx: ProbeContext) {
    PROBE.with(|p| p.set(ctx));
}

/// Helpers that read the [`ProbeContext`]: the probed address or the link's cookie.
const PROBE_CONTEXT_HELPERS: [u32; 4] = [
    id::GET_FUNC_IP,
    id::GET_ATTACH_COOKIE,
    id::GET_STACKID,
    id::GET_STACK,
];

/// Whether running `insns` may read the [`ProbeContext`], so that a probe sets it (one
/// thread-local write per hit) only for programs that can: those calling one of the
/// helpers that read it, calling helpers by register (`callx`), or tail-calling another
/// program.
pub fn reads_probe_context(insns: &[bpftime_isa::Insn]) -> bool {
    use bpftime_isa::opcode as op;
    let mut pc = 0;
    while pc < insns.len() {
        let i = insns[pc];
        if i.is_lddw() {
            pc += 2;
            continue;
        }
        if i.code == op::CALL_INSN | op::X {
            return true;
        }
        if i.code == op::CALL_INSN && i.src == op::CALL_HELPER {
            let helper = i.imm as u32;
            if helper == id::TAIL_CALL || PROBE_CONTEXT_HELPERS.contains(&helper) {
                return true;
            }
        }
        pc += 1;
    }
    false
}

static TRACE_OUTPUT: OnceLock<bpftime_store::store_dir::StoreDir> = OnceLock::new();

/// Makes `bpf_trace_printk` append its lines to the store's `trace_pipe` file.
pub fn set_trace_output(store: &crate::Store) {
    let _ = TRACE_OUTPUT.set(store.handle().clone());
}

fn clock(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out pointer.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn neg(errno: i32) -> u64 {
    (-(errno as i64)) as u64
}

/// Copies `size` bytes from `src` in this process without faulting: a bad
/// address gives `EFAULT`, as the kernel's probe_read does.
fn read_memory(dst: *mut u8, size: usize, src: u64) -> bool {
    if size == 0 {
        return true;
    }
    let local = libc::iovec {
        iov_base: dst.cast(),
        iov_len: size,
    };
    let remote = libc::iovec {
        iov_base: src as *mut libc::c_void,
        iov_len: size,
    };
    // SAFETY: reads through the kernel, which checks `src`; `dst` holds `size`
    // writable bytes (checked by the verifier).
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    n == size as isize
}

unsafe fn map_lookup_elem_work(map: u64, key: u64, _: u64, _: u64, _: u64) -> u64 {
    // SAFETY: the loader put a live Map's address in r1; the verifier checked the key.
    unsafe { (*(map as *const Map)).prog_lookup(key as *const u8) as u64 }
}

unsafe fn map_update_elem_work(map: u64, key: u64, value: u64, flags: u64, _: u64) -> u64 {
    // SAFETY: as for lookup; the verifier checked key and value sizes.
    unsafe {
        (*(map as *const Map)).prog_update(key as *const u8, value as *const u8, flags) as u64
    }
}

unsafe fn map_delete_elem_work(map: u64, key: u64, _: u64, _: u64, _: u64) -> u64 {
    // SAFETY: as for lookup.
    unsafe { (*(map as *const Map)).prog_delete(key as *const u8) as u64 }
}

unsafe fn map_push_elem_work(map: u64, value: u64, flags: u64, _: u64, _: u64) -> u64 {
    // SAFETY: as for lookup.
    unsafe { (*(map as *const Map)).prog_push(value as *const u8, flags) as u64 }
}

unsafe fn map_pop_elem_work(map: u64, value: u64, _: u64, _: u64, _: u64) -> u64 {
    // SAFETY: as for lookup.
    unsafe { (*(map as *const Map)).prog_pop(value as *mut u8, true) as u64 }
}

unsafe fn map_peek_elem_work(map: u64, value: u64, _: u64, _: u64, _: u64) -> u64 {
    // SAFETY: as for lookup.
    unsafe { (*(map as *const Map)).prog_pop(value as *mut u8, false) as u64 }
}

unsafe fn probe_read_work(dst: u64, size: u64, src: u64, _: u64, _: u64) -> u64 {
    if read_memory(dst as *mut u8, size as usize, src) {
        0
    } else {
        // SAFETY: the verifier checked dst holds `size` writable bytes.
        unsafe { std::ptr::write_bytes(dst as *mut u8, 0, size as usize) };
        neg(libc::EFAULT)
    }
}

unsafe fn probe_read_str_work(dst: u64, size: u64, src: u64, _: u64, _: u64) -> u64 {
    let (dst, size) = (dst as *mut u8, size as usize);
    if size == 0 {
        return neg(libc::EINVAL);
    }
    // Read page by page: a string may end just before an unmapped page.
    let mut done = 0usize;
    while done < size - 1 {
        let addr = src + done as u64;
        let in_page = 4096 - (addr as usize & 4095);
        let chunk = in_page.min(size - 1 - done);
        // SAFETY: dst + done .. + chunk lies within the verified buffer.
        if !read_memory(unsafe { dst.add(done) }, chunk, addr) {
            if done == 0 {
                // SAFETY: size >= 1.
                unsafe { *dst = 0 };
                return neg(libc::EFAULT);
            }
            break;
        }
        // SAFETY: the chunk was just written.
        let part = unsafe { std::slice::from_raw_parts(dst.add(done), chunk) };
        if let Some(nul) = part.iter().position(|&b| b == 0) {
            return (done + nul + 1) as u64;
        }
        done += chunk;
    }
    // SAFETY: done <= size - 1.
    unsafe { *dst.add(done) = 0 };
    (done + 1) as u64
}

unsafe fn ktime_get_ns_work(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    crate::tsc_clock::monotonic_ns()
}

unsafe fn ktime_get_boot_ns_work(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    clock(libc::CLOCK_BOOTTIME)
}

unsafe fn ktime_get_coarse_ns_work(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    clock(libc::CLOCK_MONOTONIC_COARSE)
}

unsafe fn get_prandom_u32_work(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    RNG.with(|r| {
        let mut x = r.get();
        if x == 0 {
            x = clock(libc::CLOCK_MONOTONIC) ^ pid_tgid().rotate_left(17) | 1;
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        r.set(x);
        (x >> 32) as u32 as u64
    })
}

unsafe fn get_smp_processor_id_work(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    current_cpu(possible_cpus()) as u64
}

unsafe fn get_current_pid_tgid_work(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    pid_tgid()
}

unsafe fn get_current_uid_gid_work(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    // SAFETY: getuid/getgid have no preconditions.
    unsafe { ((libc::getgid() as u64) << 32) | libc::getuid() as u64 }
}

unsafe fn get_current_comm_work(buf: u64, size: u64, _: u64, _: u64, _: u64) -> u64 {
    let mut name = [0u8; 17];
    // SAFETY: PR_GET_NAME writes at most 16 bytes.
    unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
    let size = size as usize;
    if size == 0 {
        return neg(libc::EINVAL);
    }
    let n = name
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(16)
        .min(size - 1);
    // SAFETY: the verifier checked buf holds `size` writable bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(name.as_ptr(), buf as *mut u8, n);
        std::ptr::write_bytes((buf as *mut u8).add(n), 0, size - n);
    }
    0
}

/// `bpf_get_current_task{,_btf}`: not a kernel `task_struct` (there is none here) but
/// this thread's task token, which only the task helpers read.
unsafe fn get_current_task_work(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    bpftime_maps::current_task() as u64
}

unsafe fn task_storage_get_work(map: u64, task: u64, value: u64, flags: u64, _: u64) -> u64 {
    // SAFETY: the loader put a live Map's address in r1; the verifier checked r2 is a
    // task (or NULL) and r3 a value of the map's size (or NULL).
    unsafe { (*(map as *const Map)).prog_task_storage_get(task, value as *const u8, flags) as u64 }
}

unsafe fn task_storage_delete_work(map: u64, task: u64, _: u64, _: u64, _: u64) -> u64 {
    // SAFETY: as for task_storage_get.
    unsafe { (*(map as *const Map)).prog_task_storage_delete(task) as u64 }
}

/// `bpf_current_task_under_cgroup(map, index)`: 1 when the calling thread's cgroup (v2)
/// is the cgroup at `index` of the cgroup array or below it, 0 when not; -E2BIG past
/// the array's end and -EAGAIN for an empty slot, as the kernel answers.
unsafe fn current_task_under_cgroup_work(map: u64, index: u64, _: u64, _: u64, _: u64) -> u64 {
    // SAFETY: r1 is a live Map (loader; the verifier checked it is a cgroup array).
    let m = unsafe { &*(map as *const Map) };
    if index >= u64::from(m.max_entries()) {
        return neg(libc::E2BIG);
    }
    match m.id_at(index as u32) {
        None => neg(libc::EAGAIN),
        Some(id) => u64::from(bpftime_store::cgroup::current_thread_under(id)),
    }
}

unsafe fn ringbuf_output_work(map: u64, data: u64, size: u64, flags: u64, _: u64) -> u64 {
    // SAFETY: r1 is a live Map (loader); data holds size bytes (verifier).
    unsafe { (*(map as *const Map)).ringbuf_output(data as *const u8, size, flags) as u64 }
}

unsafe fn ringbuf_reserve_work(map: u64, size: u64, flags: u64, _: u64, _: u64) -> u64 {
    // SAFETY: r1 is a live Map.
    unsafe { (*(map as *const Map)).ringbuf_reserve(size, flags) as u64 }
}

unsafe fn ringbuf_submit_work(rec: u64, flags: u64, _: u64, _: u64, _: u64) -> u64 {
    // SAFETY: the verifier tracks reservations: rec is an uncommitted record.
    unsafe { ringbuf_commit(rec as *mut u8, flags, false) };
    0
}

unsafe fn ringbuf_discard_work(rec: u64, flags: u64, _: u64, _: u64, _: u64) -> u64 {
    // SAFETY: as for submit.
    unsafe { ringbuf_commit(rec as *mut u8, flags, true) };
    0
}

unsafe fn ringbuf_query_work(map: u64, flags: u64, _: u64, _: u64, _: u64) -> u64 {
    // SAFETY: r1 is a live Map.
    unsafe { (*(map as *const Map)).ringbuf_query(flags) }
}

unsafe fn perf_event_output_work(_ctx: u64, map: u64, flags: u64, data: u64, size: u64) -> u64 {
    // SAFETY: r2 is a live Map (loader); data holds size bytes (verifier).
    unsafe {
        let data = std::slice::from_raw_parts(data as *const u8, size as usize);
        (*(map as *const Map)).perf_event_output(flags, data) as u64
    }
}

unsafe fn get_func_ip_work(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    PROBE.with(|p| p.get().func_ip)
}

unsafe fn get_attach_cookie_work(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    PROBE.with(|p| p.get().cookie)
}

/// The user call chain at a probe, `max` frames deep (none for the kernel
/// stack: a uprobe's registers are user registers, so the kernel has no
/// frames to give either).
///
/// # Safety
/// `ctx` must be the probe's `struct pt_regs`.
unsafe fn callchain(ctx: u64, user: bool, max: usize) -> Vec<u64> {
    if !user {
        return Vec::new();
    }
    let probed = PROBE.with(|p| p.get().func_ip);
    // SAFETY: caller obligation.
    let start = unsafe { crate::stack::WalkStart::from_pt_regs(ctx, probed) };
    crate::stack::user_callchain(start, max)
}

unsafe fn get_stackid_work(ctx: u64, map: u64, flags: u64, _: u64, _: u64) -> u64 {
    use bpftime_maps::stack_trace::{
        FAST_STACK_CMP, MAX_STACK_DEPTH, REUSE_STACKID, SKIP_FIELD_MASK, USER_STACK,
    };
    if flags & !(SKIP_FIELD_MASK | USER_STACK | FAST_STACK_CMP | REUSE_STACKID) != 0 {
        return neg(libc::EINVAL);
    }
    // SAFETY: r2 is a live stack trace Map (loader, verifier).
    let m = unsafe { &*(map as *const Map) };
    let skip = (flags & SKIP_FIELD_MASK) as usize;
    let depth = (m.value_size() as usize / 8 + skip).min(MAX_STACK_DEPTH as usize);
    // SAFETY: r1 is the program's context (verifier).
    let trace = unsafe { callchain(ctx, flags & USER_STACK != 0, depth) };
    if trace.len() <= skip {
        return neg(libc::EFAULT);
    }
    m.stack_trace_file(&trace[skip..], flags) as u64
}

unsafe fn get_stack_work(ctx: u64, buf: u64, size: u64, flags: u64, _: u64) -> u64 {
    use bpftime_maps::stack_trace::{MAX_STACK_DEPTH, SKIP_FIELD_MASK, USER_BUILD_ID, USER_STACK};
    let (buf, size) = (buf as *mut u8, size as usize);
    let fail = |errno: i32| {
        // SAFETY: the verifier checked buf holds `size` writable bytes.
        unsafe { std::ptr::write_bytes(buf, 0, size) };
        neg(errno)
    };
    if flags & !(SKIP_FIELD_MASK | USER_STACK | USER_BUILD_ID) != 0 {
        return fail(libc::EINVAL);
    }
    let user = flags & USER_STACK != 0;
    if flags & USER_BUILD_ID != 0 {
        return fail(if user { libc::EOPNOTSUPP } else { libc::EINVAL });
    }
    if size % 8 != 0 {
        return fail(libc::EINVAL);
    }
    let skip = (flags & SKIP_FIELD_MASK) as usize;
    let room = size / 8;
    // SAFETY: r1 is the program's context (verifier).
    let trace = unsafe { callchain(ctx, user, (room + skip).min(MAX_STACK_DEPTH as usize)) };
    if trace.len() < skip {
        return fail(libc::EFAULT);
    }
    let n = (trace.len() - skip).min(room);
    // SAFETY: n <= room frames fit in buf; the rest of buf is cleared.
    unsafe {
        std::ptr::copy_nonoverlapping(trace[skip..].as_ptr().cast::<u8>(), buf, n * 8);
        std::ptr::write_bytes(buf.add(n * 8), 0, size - n * 8);
    }
    (n * 8) as u64
}

unsafe fn strncmp_work(s1: u64, s1_size: u64, s2: u64, _: u64, _: u64) -> u64 {
    let (a, b) = (s1 as *const u8, s2 as *const u8);
    for i in 0..s1_size as usize {
        // SAFETY: s1 holds s1_size bytes (verifier); s2 is a NUL-terminated constant string.
        let (x, y) = unsafe { (*a.add(i), *b.add(i)) };
        if x != y || x == 0 {
            return (x as i32 - y as i32) as i64 as u64;
        }
    }
    0
}

unsafe fn trace_printk_work(fmt: u64, fmt_size: u64, a1: u64, a2: u64, a3: u64) -> u64 {
    // SAFETY: the verifier checked fmt holds fmt_size readable bytes.
    let f = unsafe { std::slice::from_raw_parts(fmt as *const u8, fmt_size as usize) };
    let f = &f[..f.iter().position(|&b| b == 0).unwrap_or(f.len())];
    emit_trace_line(
        &format_printk(f, &[a1, a2, a3]),
        clock(libc::CLOCK_MONOTONIC),
    )
}

/// Most arguments `bpf_trace_vprintk` takes (the kernel's `MAX_BPRINTF_VARARGS`).
const VPRINTK_MAX_ARGS: usize = 12;

unsafe fn trace_vprintk_work(fmt: u64, fmt_size: u64, data: u64, data_len: u64, _: u64) -> u64 {
    let data_len = data_len as usize;
    if !data_len.is_multiple_of(8)
        || data_len > VPRINTK_MAX_ARGS * 8
        || (data == 0 && data_len != 0)
    {
        return neg(libc::EINVAL);
    }
    // SAFETY: the verifier checked fmt holds fmt_size readable bytes.
    let f = unsafe { std::slice::from_raw_parts(fmt as *const u8, fmt_size as usize) };
    let f = &f[..f.iter().position(|&b| b == 0).unwrap_or(f.len())];
    let args: Vec<u64> = (0..data_len / 8)
        // SAFETY: the verifier checked data holds data_len readable bytes.
        .map(|i| unsafe { std::ptr::read_unaligned((data as *const u64).add(i)) })
        .collect();
    emit_trace_line(&format_printk(f, &args), clock(libc::CLOCK_MONOTONIC))
}

/// Appends `text` to the trace pipe as a `bpf_trace_printk` line of this thread (the
/// GPU's lines go out this way from the thread that drains them).
pub fn emit_trace(text: &str) {
    let _ = emit_trace_line(text, clock(libc::CLOCK_MONOTONIC));
}

/// [`emit_trace`] for a line written at `ts_ns` on `CLOCK_MONOTONIC` rather than now: a
/// GPU probe's, stamped with the GPU's calibrated clock when it wrote it.
pub fn emit_trace_at(text: &str, ts_ns: u64) {
    let _ = emit_trace_line(text, ts_ns);
}

/// Appends one trace pipe record, laid out as the kernel's trace pipe shows a
/// `bpf_trace_printk` event: task name and thread id, CPU, the latency flags
/// (none apply in user space), seconds on CLOCK_MONOTONIC, then the message.
/// The kernel ends every record with a newline of its own, so a message that
/// carries one is followed by an empty line there, and here.
fn emit_trace_line(text: &str, ts: u64) -> u64 {
    let Some(dir) = TRACE_OUTPUT.get() else {
        return neg(libc::ENOENT);
    };
    let mut comm = [0u8; 17];
    // SAFETY: PR_GET_NAME writes at most 16 bytes.
    unsafe { libc::prctl(libc::PR_GET_NAME, comm.as_mut_ptr()) };
    let comm_len = comm.iter().position(|&b| b == 0).unwrap_or(16);
    let line = format!(
        "{:>16}-{:<7} [{:03}] ..... {:>5}.{:06}: bpf_trace_printk: {}\n",
        String::from_utf8_lossy(&comm[..comm_len]),
        pid_tgid() & 0xffff_ffff,
        current_cpu(possible_cpus()),
        ts / 1_000_000_000,
        (ts % 1_000_000_000) / 1000,
        text
    );
    // One write per record: appends from many processes never interleave.
    match dir.open(
        bpftime_store::TRACE_PIPE,
        libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT,
    ) {
        Ok(mut file) => match file.write_all(line.as_bytes()) {
            Ok(()) => text.len() as u64,
            Err(_) => neg(libc::EIO),
        },
        Err(_) => neg(libc::EIO),
    }
}

/// Formats the subset of printf conversions `bpf_trace_printk` accepts.
pub fn format_printk(fmt: &[u8], args: &[u64]) -> String {
    let mut out = String::new();
    let mut args = args.iter();
    let mut i = 0;
    while i < fmt.len() {
        let c = fmt[i];
        if c != b'%' {
            out.push(c as char);
            i += 1;
            continue;
        }
        i += 1;
        if fmt.get(i) == Some(&b'%') {
            out.push('%');
            i += 1;
            continue;
        }
        let mut longs = 0;
        while fmt.get(i) == Some(&b'l') {
            longs += 1;
            i += 1;
        }
        let conv = fmt.get(i).copied().unwrap_or(b'd');
        i += 1;
        let v = args.next().copied().unwrap_or(0);
        let v32 = longs == 0;
        match conv {
            b'd' | b'i' if v32 => out.push_str(&(v as i32).to_string()),
            b'd' | b'i' => out.push_str(&(v as i64).to_string()),
            b'u' if v32 => out.push_str(&(v as u32).to_string()),
            b'u' => out.push_str(&v.to_string()),
            b'x' if v32 => out.push_str(&format!("{:x}", v as u32)),
            b'x' => out.push_str(&format!("{v:x}")),
            b'p' => out.push_str(&format!("0x{v:x}")),
            b'c' => out.push(v as u8 as char),
            b's' => {
                let mut buf = [0u8; 128];
                // SAFETY: buf is 128 writable bytes.
                let n = unsafe { probe_read_str(buf.as_mut_ptr() as u64, 128, v, 0, 0) };
                if (n as i64) > 0 {
                    out.push_str(&String::from_utf8_lossy(&buf[..n as usize - 1]));
                }
            }
            other => {
                out.push('%');
                out.push(other as char);
            }
        }
    }
    out
}

/// `bpf_snprintf(str, str_size, fmt, data, data_len)`: formats `fmt` with the u64s of
/// `data` into `str` (truncated, always NUL-terminated when `str_size` > 0) and returns
/// the length of the whole text plus its NUL, as the kernel does; -EINVAL, as the kernel
/// answers, for a format outside the kernel's set, too few arguments, or a `data_len`
/// that is not a multiple of 8 or holds more than 12 arguments.
unsafe fn snprintf_work(str: u64, str_size: u64, fmt: u64, data: u64, data_len: u64) -> u64 {
    let data_len = data_len as u32 as usize;
    if !data_len.is_multiple_of(8)
        || data_len > crate::bprintf::MAX_ARGS * 8
        || (data == 0 && data_len != 0)
    {
        return neg(libc::EINVAL);
    }
    // SAFETY: the verifier checked fmt is a readable string (a NUL within its memory).
    let fmt = unsafe { std::ffi::CStr::from_ptr(fmt as *const libc::c_char) }.to_bytes();
    let args: Vec<u64> = (0..data_len / 8)
        // SAFETY: the verifier checked data holds data_len readable bytes.
        .map(|i| unsafe { std::ptr::read_unaligned((data as *const u64).add(i)) })
        .collect();
    let read_str = |p: u64| {
        let mut buf = [0u8; 512];
        // SAFETY: buf is 512 writable bytes; probe_read_str checks p.
        let n = unsafe { probe_read_str(buf.as_mut_ptr() as u64, buf.len() as u64, p, 0, 0) };
        let n = (n as i64).max(1) as usize;
        buf[..n - 1].to_vec()
    };
    let read = |p: u64, out: &mut [u8]| read_memory(out.as_mut_ptr(), out.len(), p);
    let text = match crate::bprintf::format(fmt, &args, &read_str, &read) {
        Ok(t) => t,
        Err(_) => return neg(libc::EINVAL),
    };
    let size = str_size as u32 as usize;
    if size > 0 {
        let n = text.len().min(size - 1);
        // SAFETY: the verifier checked str holds str_size writable bytes; n < size.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), str as *mut u8, n);
            *(str as *mut u8).add(n) = 0;
        }
    }
    text.len() as u64 + 1
}

/// A callback as the JIT compiles it: a lifted subprogram,
/// `r0 = f(r1, r2, r3, r4, r5, tail_depth)`.
type JitCallback = unsafe extern "C" fn(u64, u64, u64, u64, u64, u64) -> u64;

/// `bpf_loop(nr_loops, callback, ctx, flags)` for JIT code, where `callback` is the
/// address of the lifted subprogram (the lifter turns `lddw rX, func` into it). The
/// interpreter runs its callbacks itself and never calls this.
unsafe fn bpf_loop_work(nr_loops: u64, callback: u64, ctx: u64, flags: u64, _: u64) -> u64 {
    let n = match bpftime_isa::helpers::loop_iterations(nr_loops, flags) {
        Ok(n) => n,
        Err(errno) => return neg(errno),
    };
    if n == 0 {
        return 0;
    }
    // SAFETY: the verifier checked r2 is a callback subprogram, which the JIT lowered to
    // its compiled function of this signature.
    let f: JitCallback = unsafe { std::mem::transmute::<usize, JitCallback>(callback as usize) };
    for i in 0..n {
        // A callback starts a tail-call chain at its limit: a tail call inside it falls
        // through, so a callback cannot re-enter its caller without bound.
        // SAFETY: as above; ctx is what the verifier let the program pass.
        let r = unsafe {
            f(
                u64::from(i),
                ctx,
                0,
                0,
                0,
                u64::from(bpftime_isa::uapi::MAX_TAIL_CALLS),
            )
        };
        if r != 0 {
            return u64::from(i) + 1;
        }
    }
    u64::from(n)
}

/// The helpers as JIT code and the interpreter call them: the C ABI, with the work under
/// the FFI guard, so that a panic in our code fails the call (a NULL pointer, or
/// -EFAULT) instead of aborting the process the program runs in. The hot form of the
/// guard adds nothing on the way through but an unwinding landing pad.
macro_rules! c_helpers {
    ($($name:ident => $work:ident, $failed:expr;)*) => {$(
        unsafe extern "C" fn $name(a1: u64, a2: u64, a3: u64, a4: u64, a5: u64) -> u64 {
            bpftime_ffi_guard::ffi_guard_hot!(
                concat!("helper ", stringify!($name)),
                $failed,
                // SAFETY: the caller's arguments, as JIT code or the interpreter pass them
                // to this helper (its own safety comments say what they must be).
                unsafe { $work(a1, a2, a3, a4, a5) }
            )
        }
    )*};
}

c_helpers! {
    map_lookup_elem => map_lookup_elem_work, 0;
    map_update_elem => map_update_elem_work, neg(libc::EFAULT);
    map_delete_elem => map_delete_elem_work, neg(libc::EFAULT);
    map_push_elem => map_push_elem_work, neg(libc::EFAULT);
    map_pop_elem => map_pop_elem_work, neg(libc::EFAULT);
    map_peek_elem => map_peek_elem_work, neg(libc::EFAULT);
    probe_read => probe_read_work, neg(libc::EFAULT);
    probe_read_str => probe_read_str_work, neg(libc::EFAULT);
    ktime_get_ns => ktime_get_ns_work, 0;
    ktime_get_boot_ns => ktime_get_boot_ns_work, 0;
    ktime_get_coarse_ns => ktime_get_coarse_ns_work, 0;
    get_prandom_u32 => get_prandom_u32_work, 0;
    get_smp_processor_id => get_smp_processor_id_work, 0;
    get_current_pid_tgid => get_current_pid_tgid_work, 0;
    get_current_uid_gid => get_current_uid_gid_work, 0;
    get_current_comm => get_current_comm_work, neg(libc::EFAULT);
    get_current_task => get_current_task_work, 0;
    task_storage_get => task_storage_get_work, 0;
    task_storage_delete => task_storage_delete_work, neg(libc::EFAULT);
    current_task_under_cgroup => current_task_under_cgroup_work, neg(libc::EFAULT);
    ringbuf_output => ringbuf_output_work, neg(libc::EFAULT);
    ringbuf_reserve => ringbuf_reserve_work, 0;
    ringbuf_submit => ringbuf_submit_work, neg(libc::EFAULT);
    ringbuf_discard => ringbuf_discard_work, neg(libc::EFAULT);
    ringbuf_query => ringbuf_query_work, neg(libc::EFAULT);
    perf_event_output => perf_event_output_work, neg(libc::EFAULT);
    get_func_ip => get_func_ip_work, 0;
    get_attach_cookie => get_attach_cookie_work, 0;
    get_stackid => get_stackid_work, neg(libc::EFAULT);
    get_stack => get_stack_work, neg(libc::EFAULT);
    strncmp => strncmp_work, neg(libc::EFAULT);
    trace_printk => trace_printk_work, neg(libc::EFAULT);
    trace_vprintk => trace_vprintk_work, neg(libc::EFAULT);
    snprintf => snprintf_work, neg(libc::EFAULT);
    bpf_loop => bpf_loop_work, neg(libc::EFAULT);
}

/// The helper with kernel id `id`, if this runtime provides it: the registry's CPU
/// helpers ([`bpftime_isa::helpers`]), less those the engines run themselves
/// (`bpf_tail_call`).
pub fn helper_by_id(helper: u32) -> Option<HelperFn> {
    let def = bpftime_isa::helpers::lookup(helper)?;
    if !def.available_on(bpftime_isa::helpers::Engine::Interpreter) {
        return None;
    }
    cpu_function(helper)
}

fn cpu_function(helper: u32) -> Option<HelperFn> {
    let f: HelperFn = match helper {
        id::MAP_LOOKUP_ELEM => map_lookup_elem,
        id::MAP_UPDATE_ELEM => map_update_elem,
        id::MAP_DELETE_ELEM => map_delete_elem,
        id::PROBE_READ | id::PROBE_READ_USER | id::PROBE_READ_KERNEL => probe_read,
        id::PROBE_READ_STR | id::PROBE_READ_USER_STR | id::PROBE_READ_KERNEL_STR => probe_read_str,
        id::KTIME_GET_NS => ktime_get_ns,
        id::KTIME_GET_BOOT_NS => ktime_get_boot_ns,
        id::KTIME_GET_COARSE_NS => ktime_get_coarse_ns,
        id::TRACE_PRINTK => trace_printk,
        id::TRACE_VPRINTK => trace_vprintk,
        id::GET_PRANDOM_U32 => get_prandom_u32,
        id::GET_SMP_PROCESSOR_ID => get_smp_processor_id,
        id::GET_CURRENT_PID_TGID => get_current_pid_tgid,
        id::GET_CURRENT_UID_GID => get_current_uid_gid,
        id::GET_CURRENT_COMM => get_current_comm,
        id::CURRENT_TASK_UNDER_CGROUP => current_task_under_cgroup,
        id::GET_CURRENT_TASK | id::GET_CURRENT_TASK_BTF => get_current_task,
        id::TASK_STORAGE_GET => task_storage_get,
        id::TASK_STORAGE_DELETE => task_storage_delete,
        id::MAP_PUSH_ELEM => map_push_elem,
        id::MAP_POP_ELEM => map_pop_elem,
        id::MAP_PEEK_ELEM => map_peek_elem,
        id::RINGBUF_OUTPUT => ringbuf_output,
        id::RINGBUF_RESERVE => ringbuf_reserve,
        id::RINGBUF_SUBMIT => ringbuf_submit,
        id::RINGBUF_DISCARD => ringbuf_discard,
        id::RINGBUF_QUERY => ringbuf_query,
        id::PERF_EVENT_OUTPUT => perf_event_output,
        id::GET_FUNC_IP => get_func_ip,
        id::GET_ATTACH_COOKIE => get_attach_cookie,
        id::STRNCMP => strncmp,
        id::GET_STACKID => get_stackid,
        id::GET_STACK => get_stack,
        id::SNPRINTF => snprintf,
        id::LOOP => bpf_loop,
        _ => return None,
    };
    Some(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// The ids are cached per thread: a child forked after the parent's thread cached
    /// them must still report its own process and thread.
    #[test]
    fn a_forked_child_reports_its_own_pid_tgid() {
        let parent = pid_tgid();
        // SAFETY: getpid has no preconditions.
        assert_eq!(parent >> 32, unsafe { libc::getpid() } as u64);
        // SAFETY: the child only calls pid_tgid (a cached read, or getpid/gettid and a
        // thread-local write on this thread's own cell) and `_exit`s.
        match unsafe { libc::fork() } {
            0 => {
                let child = pid_tgid();
                // SAFETY: getpid and gettid have no preconditions.
                let own = unsafe { ((libc::getpid() as u64) << 32) | libc::gettid() as u64 };
                // SAFETY: ends the child without running the test harness's exit path.
                unsafe { libc::_exit(i32::from(child != own || child == parent)) };
            }
            -1 => panic!("fork: {}", std::io::Error::last_os_error()),
            pid => {
                let mut status = 0;
                // SAFETY: waits for our own child.
                assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
                assert!(
                    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                    "the child saw its parent's ids (status {status:#x})"
                );
            }
        }
    }

    #[test]
    fn probe_read_faults_cleanly() {
        let mut buf = [0xffu8; 8];
        // SAFETY: buf is 8 writable bytes; address 8 is never mapped.
        let r = unsafe { probe_read(buf.as_mut_ptr() as u64, 8, 8, 0, 0) };
        assert_eq!(r as i64, -(libc::EFAULT as i64));
        assert_eq!(buf, [0; 8]);
        let src = 0x1122_3344_5566_7788u64;
        // SAFETY: both sides are 8-byte locals.
        let r = unsafe { probe_read(buf.as_mut_ptr() as u64, 8, &src as *const u64 as u64, 0, 0) };
        assert_eq!(r, 0);
        assert_eq!(u64::from_ne_bytes(buf), src);
    }

    #[test]
    fn probe_read_str_counts_the_nul_and_truncates() {
        let s = b"hello\0world";
        let mut buf = [0xffu8; 16];
        // SAFETY: buf is 16 writable bytes; s is readable.
        let r = unsafe { probe_read_str(buf.as_mut_ptr() as u64, 16, s.as_ptr() as u64, 0, 0) };
        assert_eq!(r, 6);
        assert_eq!(&buf[..6], b"hello\0");
        // SAFETY: as above, truncated to 4 bytes.
        let r = unsafe { probe_read_str(buf.as_mut_ptr() as u64, 4, s.as_ptr() as u64, 0, 0) };
        assert_eq!(r, 4);
        assert_eq!(&buf[..4], b"hel\0");
    }

    #[test]
    fn pid_tgid_matches_the_process() {
        // SAFETY: no arguments are used.
        let v = unsafe { get_current_pid_tgid(0, 0, 0, 0, 0) };
        assert_eq!(v >> 32, std::process::id() as u64);
        // SAFETY: gettid has no preconditions.
        assert_eq!(v & 0xffff_ffff, unsafe { libc::gettid() } as u64);
    }

    /// The dispatch table is the registry's CPU helpers: each has a function here (but
    /// the tail call, which the engines run), and nothing else does.
    #[test]
    fn every_cpu_helper_of_the_registry_has_a_function() {
        use bpftime_isa::helpers::{Engine, REGISTRY};
        for d in REGISTRY {
            let cpu = d.available_on(Engine::Interpreter);
            let expected = cpu && d.id != id::TAIL_CALL;
            assert_eq!(
                helper_by_id(d.id).is_some(),
                expected,
                "{}#{}",
                d.name,
                d.id
            );
            assert!(
                cpu || cpu_function(d.id).is_none(),
                "{} has a CPU function but is not marked for the CPU",
                d.name
            );
        }
        for other in 0..1024 {
            if bpftime_isa::helpers::lookup(other).is_none() {
                assert!(
                    cpu_function(other).is_none(),
                    "helper {other} is missing from the registry"
                );
            }
        }
    }

    fn snprintf_into(buf: &mut [u8], fmt: &str, args: &[u64]) -> i64 {
        let fmt = std::ffi::CString::new(fmt).unwrap();
        // SAFETY: buf and args are live locals of the sizes given.
        unsafe {
            snprintf(
                buf.as_mut_ptr() as u64,
                buf.len() as u64,
                fmt.as_ptr() as u64,
                args.as_ptr() as u64,
                (args.len() * 8) as u64,
            ) as i64
        }
    }

    #[test]
    fn snprintf_truncates_and_counts_the_nul() {
        let mut buf = [0xffu8; 8];
        let s = c"str";
        let n = snprintf_into(&mut buf, "%d-%s!", &[-12i64 as u64, s.as_ptr() as u64]);
        assert_eq!(n, 9, "\"-12-str!\" and its NUL");
        assert_eq!(&buf, b"-12-str\0");
        let mut big = [0u8; 16];
        assert_eq!(snprintf_into(&mut big, "%05x|%c", &[255, b'z' as u64]), 8);
        assert_eq!(&big[..8], b"000ff|z\0");
        // A zero-sized buffer is left alone and the length still counted.
        assert_eq!(snprintf_into(&mut [], "abc", &[]), 4);
    }

    #[test]
    fn snprintf_errors_match_the_kernel() {
        let mut buf = [0u8; 8];
        let einval = -(libc::EINVAL as i64);
        assert_eq!(snprintf_into(&mut buf, "%d %d", &[1]), einval);
        assert_eq!(snprintf_into(&mut buf, "%y", &[1]), einval);
        let fmt = c"%d";
        let args = [1u64; 13];
        let call = |len: u64| {
            // SAFETY: buf and args are live; len never exceeds args' size.
            unsafe {
                snprintf(
                    buf.as_ptr() as u64,
                    8,
                    fmt.as_ptr() as u64,
                    args.as_ptr() as u64,
                    len,
                ) as i64
            }
        };
        assert_eq!(call(12), einval);
        assert_eq!(call(13 * 8), einval);
        assert_eq!(call(12 * 8), 2);
    }

    #[test]
    fn loop_runs_the_callback_until_it_stops() {
        static CALLS: AtomicU64 = AtomicU64::new(0);
        unsafe extern "C" fn cb(i: u64, ctx: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
            CALLS.fetch_add(1, Ordering::Relaxed);
            // SAFETY: ctx is the test's u64.
            unsafe { *(ctx as *mut u64) += i };
            u64::from(i == 4)
        }
        let mut sum = 0u64;
        let ctx = &mut sum as *mut u64 as u64;
        let f = cb as JitCallback as usize as u64;
        // SAFETY: f has the callback ABI; ctx is a live u64.
        let run = |n: u64, flags: u64| unsafe { bpf_loop(n, f, ctx, flags, 0) as i64 };
        assert_eq!(run(3, 0), 3);
        assert_eq!(run(10, 0), 5, "stops after the iteration that returned 1");
        assert_eq!(sum, 3 + 10);
        assert_eq!(run(0, 0), 0);
        assert_eq!(run(3, 1), -(libc::EINVAL as i64));
        assert_eq!(run((1 << 23) + 1, 0), -(libc::E2BIG as i64));
        assert_eq!(CALLS.load(Ordering::Relaxed), 8);
    }

    #[test]
    fn printk_formats_like_the_kernel() {
        let s = format_printk(b"a=%d b=%u c=%lx d=%llu %%\n", &[(-5i64) as u64, 7, 255, 9]);
        assert_eq!(s, "a=-5 b=7 c=ff d=9 %\n");
    }
}
