//! Mappings of store files that the shim hands to the loader: libbpf's pages of ring
//! buffer maps and perf buffer rings, and mmapable arrays. libbpf reads positions and
//! record lengths straight from them, so a store file that another process truncates or
//! overwrites would end the loader (a read past a truncated file raises SIGBUS) or lead
//! it outside the mapping (a record length beyond what was written). Each mapping is
//! kept in the runtime's fault table while the loader holds it; before and after each
//! epoll wait on a ring, the ring is checked as libbpf is about to read it, and a
//! damaged one is condemned: its pages become zeros, which libbpf reads as an empty
//! ring, and one warning says which ring and why.

use crate::core::Shim;
use bpftime_isa::uapi::ringbuf as rb;
use bpftime_runtime::{Damage, GuardedMapping, PAGE_SIZE};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The object whose file a handed-out mapping shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Owner {
    Map(u32),
    PerfEvent(u32),
}

/// What a handed-out mapping holds, as libbpf lays it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A ring buffer's consumer page (the consumer position first).
    RingConsumer,
    /// A ring buffer's producer page (the producer position first), then its data of
    /// `ring` bytes mapped twice.
    RingProducer { ring: u64 },
    /// A perf buffer ring: the `perf_event_mmap_page`, then the data pages.
    PerfRing { data: u64 },
    /// Anything else (an mmapable array's values): checked for faults only.
    Plain,
}

/// One mapping the loader holds.
pub(crate) struct Handed {
    guard: GuardedMapping,
    owner: Owner,
    role: Role,
}

/// Where the kernel's `perf_event_mmap_page` keeps the producer's and the consumer's
/// positions.
const PERF_DATA_HEAD: usize = 1024;
const PERF_DATA_TAIL: usize = 1032;
const PERF_RECORD_LOST: u32 = 2;
const PERF_RECORD_SAMPLE: u32 = 9;
/// A lost record: its header, an id and the count.
const PERF_LOST_LEN: u64 = 24;
/// A sample's header and the u32 size of its raw data.
const PERF_SAMPLE_HEAD: u64 = 12;

/// The ring bytes a ring buffer record of `size` bytes takes, as its consumer steps.
fn ring_record_len(size: u32) -> u64 {
    (u64::from(size) + u64::from(rb::HDR_SZ) + 7) & !7
}

/// Why a ring buffer, as libbpf is about to read it, would lead libbpf astray: its
/// consumer position at `cons`, its producer position followed by `ring` bytes of data
/// (mapped twice) at `prod`.
///
/// # Safety
/// `cons` holds 8 readable bytes, `prod` a page and then `2 * ring` readable bytes.
unsafe fn ring_garbage(cons: *const u8, prod: *const u8, ring: u64) -> Option<&'static str> {
    // SAFETY: caller obligation; both are page-aligned, so the words are aligned.
    let (c, p) = unsafe {
        (
            (*(cons as *const AtomicU64)).load(Ordering::Acquire),
            (*(prod as *const AtomicU64)).load(Ordering::Acquire),
        )
    };
    if c % 8 != 0 || p % 8 != 0 {
        return Some("its consumer or producer position is not a record boundary");
    }
    if c > p || p - c > ring {
        return Some("its consumer and producer positions are more than a ring apart (the reader would step outside the ring)");
    }
    let mut at = c;
    while at < p {
        // SAFETY: `at & (ring - 1)` is inside the data, and the header is 8-aligned.
        let len = unsafe {
            (*(prod.add(PAGE_SIZE + (at & (ring - 1)) as usize) as *const AtomicU32))
                .load(Ordering::Acquire)
        };
        if len & rb::BUSY_BIT != 0 {
            // Still being written: what follows is read after its commit, next time.
            break;
        }
        let step = ring_record_len(len & !(rb::BUSY_BIT | rb::DISCARD_BIT));
        if step > p - at {
            return Some(
                "a record is longer than what was written (the reader would step outside the ring)",
            );
        }
        at += step;
    }
    None
}

/// Why a perf buffer ring (its metadata page, then `data` bytes at `base`), as libbpf is
/// about to read it, would lead libbpf astray.
///
/// # Safety
/// `base` holds a page and then `data` readable bytes; `data` is a power of two.
unsafe fn perf_garbage(base: *const u8, data: u64) -> Option<&'static str> {
    let word = |off: usize| {
        // SAFETY: caller obligation: inside the metadata page, 8-aligned.
        unsafe { (*(base.add(off) as *const AtomicU64)).load(Ordering::Acquire) }
    };
    let tail = word(PERF_DATA_TAIL);
    let head = word(PERF_DATA_HEAD);
    if tail > head || head - tail > data {
        return Some("its consumer and producer positions are more than a ring apart (the reader would step outside the ring)");
    }
    let byte = |at: u64| {
        // SAFETY: the index is taken modulo the data's size.
        unsafe { *base.add(PAGE_SIZE + (at & (data - 1)) as usize) }
    };
    let read = |at: u64, n: u64| (0..n).fold(0u64, |v, i| v | u64::from(byte(at + i)) << (8 * i));
    let mut at = tail;
    while at < head {
        let kind = read(at, 4) as u32;
        let size = read(at + 6, 2);
        if size < 8 || size % 8 != 0 || size > head - at {
            return Some("a record's size does not fit what was written");
        }
        let fits = match kind {
            PERF_RECORD_SAMPLE => PERF_SAMPLE_HEAD + read(at + 8, 4) <= size,
            PERF_RECORD_LOST => size >= PERF_LOST_LEN,
            _ => return Some("a record of a kind no producer writes"),
        };
        if !fits {
            return Some("a sample is longer than its record (the reader would step outside it)");
        }
        at += size;
    }
    None
}

impl Shim {
    /// Keeps the mapping of `len` bytes at `base`, just made for the loader, in the fault
    /// table until the loader unmaps it.
    ///
    /// # Safety
    /// `base..base + len` is the mapping just made, which only the loader's `munmap`
    /// (reported through [`Shim::munmapped`]) or a fixed mapping over it removes.
    pub(crate) unsafe fn hand_out(&mut self, base: *mut u8, len: usize, owner: Owner, role: Role) {
        // SAFETY: forwarded caller obligation.
        let guard = unsafe { bpftime_runtime::guard_mapping(base, len) };
        self.handed.push(Handed { guard, owner, role });
    }

    /// Before the loader unmaps (or maps over) `len` bytes at `addr`: the mappings handed
    /// out there leave the fault table, after their damage, if any, is reported.
    pub fn munmapped(&mut self, addr: usize, len: usize) {
        self.check_handed(None);
        self.handed.retain(|h| !h.guard.overlaps(addr, len));
    }

    /// Checks the mappings handed out: a fault on one (its file truncated) is reported
    /// once (an error: `bpftime run` shows its loader's errors only); so is a ring that libbpf, reading it now, would be led astray by. Both
    /// condemn every mapping of that ring (positions then read zero on both pages, an
    /// empty ring). Rings are checked only where `epfd` is None or waits on them.
    pub fn check_handed(&mut self, epfd: Option<i32>) {
        if self.handed.is_empty() {
            return;
        }
        let watched: Option<Vec<Owner>> = epfd.map(|e| self.watched_owners(e));
        let mut bad: Vec<(Owner, String)> = Vec::new();
        for h in &self.handed {
            if self.condemned.contains(&h.owner) || bad.iter().any(|(o, _)| *o == h.owner) {
                continue;
            }
            if let Some(d) = h.guard.damage() {
                bad.push((h.owner, d.describe().to_string()));
                continue;
            }
            if watched.as_ref().is_some_and(|w| !w.contains(&h.owner)) {
                continue;
            }
            let why = match h.role {
                Role::RingProducer { ring } => self
                    .handed
                    .iter()
                    .find(|c| c.owner == h.owner && c.role == Role::RingConsumer)
                    // SAFETY: both are live mappings of this ring, laid out as their
                    // roles say (hand_out's obligation).
                    .and_then(|c| unsafe {
                        ring_garbage(
                            c.guard.start() as *const u8,
                            h.guard.start() as *const u8,
                            ring,
                        )
                    }),
                // SAFETY: as above.
                Role::PerfRing { data } => unsafe {
                    perf_garbage(h.guard.start() as *const u8, data)
                },
                Role::RingConsumer | Role::Plain => None,
            };
            if let Some(why) = why {
                bad.push((h.owner, why.to_string()));
            }
        }
        for (owner, why) in bad {
            let mut whole = true;
            for h in self.handed.iter().filter(|h| h.owner == owner) {
                whole &= h.guard.condemn(Damage::Garbage);
            }
            self.condemned.insert(owner);
            let what = self.describe_owner(owner);
            let then = if whole {
                "this tool reads no more events from it (its pages read as zeros here)"
            } else {
                "this tool's view of it could not be replaced (the kernel refused), so what it reads from it may be wrong"
            };
            tracing::error!("{what} is damaged: {why}; {then}; remove the store with `bpftime list --clean` and load the tool again");
        }
    }

    /// Whether the ring of `owner` was condemned: its wake-ups are no longer made.
    pub(crate) fn is_condemned(&self, owner: Owner) -> bool {
        self.condemned.contains(&owner)
    }

    fn watched_owners(&self, epfd: i32) -> Vec<Owner> {
        self.epolls
            .get(&epfd)
            .map(|l| l.iter().map(|(_, _, w)| w.owner()).collect())
            .unwrap_or_default()
    }

    fn describe_owner(&self, owner: Owner) -> String {
        match owner {
            Owner::Map(id) => {
                let path = self.store().path(bpftime_runtime::ObjectKind::Map, id);
                format!("map {id} ({}), as this tool maps it,", path.display())
            }
            Owner::PerfEvent(id) => format!(
                "the perf buffer ring of event {id} ({}), as this tool maps it,",
                self.store().perf_ring_path(id).display()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring buffer's consumer page, and its producer page followed by `ring` bytes of
    /// data twice, in plain memory.
    struct Ring {
        cons: Vec<u64>,
        prod: Vec<u64>,
        ring: u64,
    }

    impl Ring {
        fn new(ring: u64) -> Ring {
            Ring {
                cons: vec![0; PAGE_SIZE / 8],
                prod: vec![0; (PAGE_SIZE + 2 * ring as usize) / 8],
                ring,
            }
        }

        /// Writes a committed record of `size` bytes at position `at`.
        fn record(&mut self, at: u64, size: u32) {
            let i = (PAGE_SIZE as u64 + (at & (self.ring - 1))) / 8;
            self.prod[i as usize] = u64::from(size);
        }

        fn garbage(&self, c: u64, p: u64) -> Option<&'static str> {
            let mut r = Ring {
                cons: self.cons.clone(),
                prod: self.prod.clone(),
                ring: self.ring,
            };
            r.cons[0] = c;
            r.prod[0] = p;
            // SAFETY: the vectors are as long as ring_garbage reads.
            unsafe { ring_garbage(r.cons.as_ptr().cast(), r.prod.as_ptr().cast(), r.ring) }
        }
    }

    #[test]
    fn ring_positions_and_lengths_a_producer_leaves_pass_and_garbage_is_named() {
        let mut r = Ring::new(4096);
        r.record(0, 16); // 24 bytes
        r.record(24, 0); // 8 bytes
        r.record(32, 100); // 112 bytes
        assert_eq!(r.garbage(0, 144), None);
        assert_eq!(r.garbage(24, 144), None);
        assert_eq!(r.garbage(144, 144), None, "an empty ring");
        // Zeroed data reads as empty records, which step inside what was written.
        assert_eq!(Ring::new(4096).garbage(0, 4096), None);
        assert!(r.garbage(0, 4096 + 8).is_some(), "more than a ring written");
        assert!(r.garbage(200, 144).is_some(), "consumer past producer");
        assert!(r.garbage(4, 144).is_some(), "not a record boundary");
        assert!(
            r.garbage(0, 136).is_some(),
            "the last record ends past the producer"
        );
        r.record(144, 1 << 29);
        assert!(r.garbage(144, 152).is_some(), "a length beyond the ring");
        // A record being written stops the walk: its length is not read yet.
        r.record(144, rb::BUSY_BIT | (1 << 29));
        assert_eq!(r.garbage(144, 152), None);
    }

    /// A perf ring: the metadata page, then `data` bytes.
    fn perf(
        data: u64,
        head: u64,
        tail: u64,
        records: &[(u64, u32, u16, u32)],
    ) -> Option<&'static str> {
        let mut m = vec![0u8; PAGE_SIZE + data as usize];
        m[PERF_DATA_HEAD..PERF_DATA_HEAD + 8].copy_from_slice(&head.to_ne_bytes());
        m[PERF_DATA_TAIL..PERF_DATA_TAIL + 8].copy_from_slice(&tail.to_ne_bytes());
        let mut put = |at: u64, bytes: &[u8]| {
            for (i, b) in bytes.iter().enumerate() {
                m[PAGE_SIZE + ((at + i as u64) % data) as usize] = *b;
            }
        };
        for &(at, kind, size, raw) in records {
            put(at, &kind.to_ne_bytes());
            put(at + 6, &size.to_ne_bytes());
            put(at + 8, &raw.to_ne_bytes());
        }
        let words: Vec<u64> = m
            .chunks(8)
            .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        // SAFETY: a page and `data` bytes.
        unsafe { perf_garbage(words.as_ptr().cast(), data) }
    }

    #[test]
    fn perf_records_a_producer_leaves_pass_and_garbage_is_named() {
        // A sample's raw size is padded so that its record ends 8-aligned.
        let sample = |at, raw: u32| (at, PERF_RECORD_SAMPLE, (12 + raw) as u16, raw);
        // Two samples, the second wrapping past the end of the data, then a loss.
        let ok = [
            sample(4064, 12),
            sample(4088, 20),
            (4120, PERF_RECORD_LOST, 24, 0),
        ];
        assert_eq!(perf(4096, 4144, 4064, &ok), None);
        assert_eq!(perf(4096, 4144, 4088, &ok), None);
        assert_eq!(perf(4096, 0, 0, &[]), None, "zeroed: empty");
        assert!(perf(4096, 4144, 4152, &ok).is_some(), "tail past head");
        assert!(perf(4096, 4096 * 3, 0, &[]).is_some(), "more than a ring");
        assert!(
            perf(4096, 8, 0, &[(0, 0, 8, 0)]).is_some(),
            "an unknown kind"
        );
        assert!(
            perf(4096, 32, 0, &[(0, PERF_RECORD_SAMPLE, 0, 0)]).is_some(),
            "size 0"
        );
        assert!(
            perf(4096, 32, 0, &[(0, PERF_RECORD_SAMPLE, 64, 4)]).is_some(),
            "past head"
        );
        assert!(
            perf(4096, 32, 0, &[(0, PERF_RECORD_SAMPLE, 32, 1 << 30)]).is_some(),
            "raw too long"
        );
    }
}
