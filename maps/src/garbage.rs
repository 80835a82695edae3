//! Collection of objects nothing refers to any more: a mark and sweep over the store
//! (`bpftime-store`'s `lifetime.rs` says what refers to what, and why the store lock
//! makes it safe). It lives here because a program array's and a perf event array's
//! references are in the map's contents.

use crate::Map;
use bpftime_store::layout::MapHeader;
use bpftime_store::{LinkRecord, ObjectInfo, ObjectKind, ProgramRecord, Store};
use std::collections::{HashMap, HashSet};
use std::os::unix::fs::FileExt;

/// Frees every object nothing refers to any more, and temporary files left by
/// processes that died while creating an object. Returns what was freed.
pub fn collect_garbage(store: &Store) -> Vec<ObjectInfo> {
    let _lock = match store.hold_for_collection() {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("cannot collect unreferenced objects: {e}");
            return Vec::new();
        }
    };
    let mut objects = Vec::new();
    let mut roots = Vec::new();
    for kind in ObjectKind::ALL {
        for id in store.ids(kind) {
            // None when the file cannot be opened (it is gone).
            let held = store.is_referenced_by_a_descriptor(kind, id);
            match held {
                Some(true) => roots.push((kind, id)),
                Some(false) => {}
                None => continue,
            }
            objects.push((kind, id));
        }
    }
    roots.extend(store.pins().into_iter().map(|p| (p.kind, p.id)));
    let links: HashMap<u32, LinkRecord> = store
        .ids(ObjectKind::Link)
        .into_iter()
        .filter_map(|id| LinkRecord::read(store, id).ok().map(|l| (id, l)))
        .collect();
    let mut live = HashSet::new();
    while let Some(o) = roots.pop() {
        if live.insert(o) {
            roots.extend(references(store, o, &links));
        }
    }
    let mut freed = Vec::new();
    for (kind, id) in objects {
        if live.contains(&(kind, id)) {
            continue;
        }
        let info = store.info(kind, id);
        match store.remove(kind, id) {
            Ok(()) => {
                tracing::debug!(kind = kind.prefix(), id, "freed: no references left");
                freed.extend(info);
            }
            Err(e) => tracing::warn!("cannot free {} {id}: {e}", kind.prefix()),
        }
    }
    store.remove_stale_temporaries();
    freed
}

/// The objects `o` holds.
fn references(
    store: &Store,
    (kind, id): (ObjectKind, u32),
    links: &HashMap<u32, LinkRecord>,
) -> Vec<(ObjectKind, u32)> {
    let mut out = Vec::new();
    match kind {
        ObjectKind::Link => {
            if let Some(l) = links.get(&id) {
                out.push((ObjectKind::Program, l.prog_id));
                if l.perf_event_id != 0 {
                    out.push((ObjectKind::PerfEvent, l.perf_event_id));
                }
            }
        }
        ObjectKind::PerfEvent => out.extend(
            links
                .values()
                .filter(|l| l.owned_by_event && l.perf_event_id == id)
                .map(|l| (ObjectKind::Link, l.id)),
        ),
        ObjectKind::Program => {
            if let Ok(p) = ProgramRecord::read(store, id) {
                out.extend(p.map_ids.iter().map(|&m| (ObjectKind::Map, m)));
            }
        }
        ObjectKind::Map => out.extend(map_references(store, id)),
        ObjectKind::Btf => {}
    }
    out
}

fn map_references(store: &Store, id: u32) -> Vec<(ObjectKind, u32)> {
    use bpftime_isa::uapi::map_type;
    let Ok((file, _)) = bpftime_store::open_object_in(store.handle(), ObjectKind::Map, id) else {
        return Vec::new();
    };
    let mut buf = [0u8; std::mem::size_of::<MapHeader>()];
    if file.read_exact_at(&mut buf, 0).is_err() {
        return Vec::new();
    }
    let field =
        |offset: usize| u32::from_ne_bytes(buf[offset..offset + 4].try_into().unwrap_or_default());
    let mut out = Vec::new();
    let btf = field(std::mem::offset_of!(MapHeader, btf_id));
    if btf != 0 {
        out.push((ObjectKind::Btf, btf));
    }
    let held = match field(std::mem::offset_of!(MapHeader, map_type)) {
        map_type::PROG_ARRAY => ObjectKind::Program,
        map_type::PERF_EVENT_ARRAY => ObjectKind::PerfEvent,
        _ => return out,
    };
    if let Ok(m) = Map::open(store, id) {
        out.extend(
            (0..m.max_entries())
                .filter_map(|i| m.id_at(i))
                .map(|e| (held, e)),
        );
    }
    out
}
