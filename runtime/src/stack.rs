//! User-space call chains, walked the way the kernel's perf callchain walks
//! them on x86-64: the probed instruction pointer, then (at a function entry
//! that has not yet saved a frame) the return address at the stack pointer,
//! then the return address of every frame in the frame-pointer chain from
//! `rbp`. Every read goes through the kernel (`process_vm_readv`), so a broken
//! chain ends the walk instead of faulting.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Turns a return address read from the stack slot at `slot` back into the
/// caller's real one, where a uretprobe replaced it with its trampoline.
pub type ReturnAddressResolver = fn(slot: u64, value: u64) -> u64;

static RESOLVER: AtomicUsize = AtomicUsize::new(0);

/// Registers how return addresses that uretprobes replaced are read back (the
/// agent knows, from its hooks); without one, a frame below a pending
/// uretprobe shows the trampoline's address where the kernel shows the caller.
pub fn set_return_address_resolver(f: ReturnAddressResolver) {
    RESOLVER.store(f as usize, Ordering::Release);
}

fn resolve_return(slot: u64, value: u64) -> u64 {
    match RESOLVER.load(Ordering::Acquire) {
        0 => value,
        f => {
            // SAFETY: only set_return_address_resolver stores here, from a
            // ReturnAddressResolver.
            let f: ReturnAddressResolver = unsafe { std::mem::transmute(f) };
            f(slot, value)
        }
    }
}

/// Offsets in the kernel's x86-64 `struct pt_regs`, the uprobe context.
const PT_REGS_BP: usize = 32;
const PT_REGS_IP: usize = 128;
const PT_REGS_SP: usize = 152;

/// The highest user address plus one, less a guard page (`TASK_SIZE_MAX`).
const USER_ADDR_END: u64 = 0x7fff_ffff_f000;

/// Registers a walk starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WalkStart {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// True when `ip` is a probed instruction that has not run yet (a uprobe,
    /// not a uretprobe): a frame-saving first instruction there means the
    /// caller's return address is at `sp` and not yet in the chain.
    pub at_probe: bool,
}

impl WalkStart {
    /// Reads the start registers from a uprobe context (`struct pt_regs`).
    ///
    /// # Safety
    /// `ctx` must point to a readable `struct pt_regs`.
    pub unsafe fn from_pt_regs(ctx: u64, probed_ip: u64) -> WalkStart {
        let field = |off: usize| {
            // SAFETY: caller obligation: the context is a whole pt_regs.
            unsafe { std::ptr::read_unaligned((ctx as usize + off) as *const u64) }
        };
        let ip = field(PT_REGS_IP);
        WalkStart {
            ip,
            sp: field(PT_REGS_SP),
            bp: field(PT_REGS_BP),
            at_probe: probed_ip != 0 && ip == probed_ip,
        }
    }
}

/// Reads `N` words of this process's memory, or None where any is unmapped.
fn read_words<const N: usize>(addr: u64) -> Option<[u64; N]> {
    let mut v = [0u64; N];
    let local = libc::iovec {
        iov_base: v.as_mut_ptr().cast(),
        iov_len: 8 * N,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: 8 * N,
    };
    // SAFETY: the kernel checks `addr`; `v` is 8 * N writable bytes.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    (n == 8 * N as isize).then_some(v)
}

/// The call chain from `start`, at most `max` entries deep.
pub fn user_callchain(start: WalkStart, max: usize) -> Vec<u64> {
    let mut out = Vec::with_capacity(max.min(128));
    if max == 0 {
        return out;
    }
    out.push(start.ip);
    if start.at_probe && out.len() < max && first_insn_saves_frame(start.ip) {
        if let Some([ret]) = read_words::<1>(start.sp) {
            out.push(resolve_return(start.sp, ret));
        }
    }
    let mut fp = start.bp;
    while out.len() < max {
        match fp.checked_add(16) {
            Some(end) if end <= USER_ADDR_END => {}
            _ => break,
        }
        // A frame is the caller's frame pointer, then the return address.
        let Some([next, ret]) = read_words::<2>(fp) else {
            break;
        };
        out.push(resolve_return(fp + 8, ret));
        fp = next;
    }
    out
}

/// Whether the instruction originally at `ip` is `push %rbp` or `endbr64`,
/// the first instruction of a function that keeps frame pointers. The code
/// in memory may carry a hook's jump, so the bytes are read from the file
/// mapped there. Answers are cached per address.
fn first_insn_saves_frame(ip: u64) -> bool {
    static CACHE: Mutex<Option<HashMap<u64, bool>>> = Mutex::new(None);
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    let cache = cache.get_or_insert_with(HashMap::new);
    if let Some(&v) = cache.get(&ip) {
        return v;
    }
    let v = original_bytes(ip).is_some_and(|b| b[0] == 0x55 || b == [0xf3, 0x0f, 0x1e, 0xfa]);
    cache.insert(ip, v);
    v
}

fn original_bytes(ip: u64) -> Option<[u8; 4]> {
    use std::os::unix::fs::FileExt;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    for line in maps.lines() {
        // start-end perms offset dev inode path (the path may hold spaces)
        let mut f = line.splitn(6, ' ');
        let (lo, hi) = f.next()?.split_once('-')?;
        let (lo, hi) = (
            u64::from_str_radix(lo, 16).ok()?,
            u64::from_str_radix(hi, 16).ok()?,
        );
        if ip < lo || ip >= hi {
            continue;
        }
        let offset = u64::from_str_radix(f.nth(1)?, 16).ok()?;
        let path = f.nth(2)?.trim_start();
        if !path.starts_with('/') {
            return None;
        }
        let file = std::fs::File::open(path).ok()?;
        let mut b = [0u8; 4];
        file.read_exact_at(&mut b, ip - lo + offset).ok()?;
        return Some(b);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_of_frames_is_walked_and_a_broken_one_ends_cleanly() {
        // Three frames on the heap: [next, return address] each, the last
        // pointing at an unmapped address.
        let frames: Vec<u64> = vec![0, 0x1111, 0, 0x2222, 8, 0x3333];
        let base = frames.as_ptr() as u64;
        let mut frames = frames;
        frames[0] = base + 16;
        frames[2] = base + 32;
        let start = WalkStart {
            ip: 0xabc,
            sp: 0,
            bp: base,
            at_probe: false,
        };
        assert_eq!(
            user_callchain(start, 16),
            vec![0xabc, 0x1111, 0x2222, 0x3333]
        );
        assert_eq!(user_callchain(start, 2), vec![0xabc, 0x1111]);
        assert_eq!(user_callchain(start, 0), Vec::<u64>::new());
        let kernel_half = WalkStart {
            bp: 0xffff_8000_0000_0000,
            ..start
        };
        assert_eq!(user_callchain(kernel_half, 16), vec![0xabc]);
        // A resolver sees each slot and the value read there.
        fn fix(slot: u64, value: u64) -> u64 {
            if value == 0x2222 {
                slot
            } else {
                value
            }
        }
        set_return_address_resolver(fix);
        let got = user_callchain(start, 16);
        RESOLVER.store(0, Ordering::Release);
        assert_eq!(got, vec![0xabc, 0x1111, base + 24, 0x3333]);
    }

    #[test]
    fn original_code_is_read_from_the_mapped_file() {
        // Unhooked code: what the file holds is what runs.
        let f = original_code_is_read_from_the_mapped_file as fn() as usize as u64;
        // SAFETY: reads 4 bytes of this function's own code.
        let running = unsafe { std::ptr::read_unaligned(f as *const [u8; 4]) };
        assert_eq!(original_bytes(f), Some(running));
        let on_heap = Box::new(0u64);
        assert_eq!(original_bytes(&*on_heap as *const u64 as u64), None);
    }
}
