//! A table of handles a map opens on first use (a perf event array's rings, a map of
//! maps' inner maps), read by programs far more often than written.
//!
//! Writers copy it, add to the copy and swap it in; the lock is held only to take or
//! swap a reference, so nothing allocates or frees under it. A program may reach the
//! table from a system call hook on a thread inside `fork()`, which holds every `malloc`
//! lock: had another thread held this lock while waiting for `malloc`, each would wait for
//! the other for ever.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Values by `u32` id, copied on write (see the module's comment). The values are handles
/// (`Arc`s): cloning one allocates nothing, so it may happen under the lock.
pub(crate) struct CowTable<V> {
    now: Mutex<Arc<HashMap<u32, V>>>,
}

impl<V> Default for CowTable<V> {
    fn default() -> Self {
        CowTable {
            now: Mutex::new(Arc::new(HashMap::new())),
        }
    }
}

impl<V: Clone> CowTable<V> {
    /// The table as it is now.
    pub(crate) fn now(&self) -> Arc<HashMap<u32, V>> {
        self.now.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The value kept for `id`, if there is one. Looked up under the lock (cloning a
    /// handle allocates nothing), which spares the table's own reference count on a
    /// program's every output.
    pub(crate) fn get(&self, id: u32) -> Option<V> {
        self.now
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
    }

    /// The value kept for `id`: the one another thread put there first, or `made` (made
    /// by the caller without the lock) added.
    pub(crate) fn get_or_insert(&self, id: u32, made: V) -> V {
        let mut seen = self.now();
        loop {
            if let Some(v) = seen.get(&id) {
                return v.clone();
            }
            let mut next = (*seen).clone();
            next.insert(id, made.clone());
            let next = Arc::new(next);
            let mut now = self.now.lock().unwrap_or_else(|p| p.into_inner());
            if Arc::ptr_eq(&now, &seen) {
                let old = std::mem::replace(&mut *now, next);
                drop(now);
                // After the lock is let go: it may be the last reference to a table.
                drop(old);
                return made;
            }
            // Another thread swapped in a table meanwhile: look again in its table.
            let newer = now.clone();
            drop(now);
            seen = newer;
        }
    }
}
