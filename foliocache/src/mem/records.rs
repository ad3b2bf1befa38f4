//! The file records of a shared cache, as its owner hands them out: one record per file key
//! (device and inode), with a generation bumped whenever a record is given to another file, so
//! a client holding an old (record, generation) pair can tell (`docs/SHARED.md`, "The file table
//! and the fill path").
//!
//! The records themselves are in the mapping (`mem::shared::FileRecord`); the owner keeps the
//! key-to-record map here, in its own memory, and a new owner rebuilds it from the records.

use super::shared::SharedMap;
use crate::error::Error;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

/// What a record names.
pub(crate) mod key_kind {
    /// A file of a local file system: (device, inode).
    pub(crate) const DISK: u32 = 1;
}

/// A record's state word.
pub(crate) const LIVE: u32 = 1;

/// The id a record's folios carry in their descriptors: unique to the record's generation, and
/// below 2^48 (`mem::nodes::NODE_PAGE` and the other marks are far above).
pub(crate) fn mapping_id(record: usize, generation: u32) -> u64 {
    1 + record as u64 + (u64::from(generation) << 24)
}

/// The owner's table of file records.
#[derive(Debug)]
pub(crate) struct Records {
    map: Arc<SharedMap>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    by_key: HashMap<(u64, u64), usize>,
    free: Vec<usize>,
}

/// A record handed out: where, which generation, its folios' id, and whether the file was new
/// to the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Assigned {
    pub(crate) record: usize,
    pub(crate) generation: u32,
    pub(crate) mapping_id: u64,
    pub(crate) new: bool,
}

impl Records {
    /// The table over `map`'s records, every live one keyed (a new owner adopting a mapping; a
    /// new mapping has none). A record whose key repeats an earlier one's is freed.
    pub(crate) fn new(map: Arc<SharedMap>) -> Self {
        let mut state = State::default();
        for (i, rec) in map.files().iter().enumerate().rev() {
            if rec.state.load(Ordering::Acquire) == LIVE
                && rec.kind.load(Ordering::Acquire) == key_kind::DISK
            {
                let key = (
                    rec.dev.load(Ordering::Acquire),
                    rec.ino.load(Ordering::Acquire),
                );
                if state.by_key.insert(key, i).is_none() {
                    continue;
                }
                rec.state.store(0, Ordering::Release);
            }
            state.free.push(i);
        }
        Self {
            map,
            state: Mutex::new(state),
        }
    }

    /// The record of the file `(dev, ino)`, given a fresh one (root 0, size 0, errseq 0, a new
    /// generation) if it has none. `path` is kept in the record (for a new owner).
    pub(crate) fn assign(
        &self,
        dev: u64,
        ino: u64,
        max_order: u8,
        path: &std::path::Path,
    ) -> Result<Assigned, Error> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        crate::inject::kill::point("records");
        let files = self.map.files();
        if let Some(&record) = state.by_key.get(&(dev, ino)) {
            let rec = &files[record];
            rec.set_path(path);
            let generation = rec.generation.load(Ordering::Acquire);
            return Ok(Assigned {
                record,
                generation,
                mapping_id: rec.mapping_id.load(Ordering::Acquire),
                new: false,
            });
        }
        let record = state.free.pop().ok_or_else(|| {
            Error::SharedMapping(format!(
                "all {} file records are in use (a larger cache has more)",
                files.len()
            ))
        })?;
        let rec = &files[record];
        let generation = rec.generation.load(Ordering::Acquire).wrapping_add(1);
        let id = mapping_id(record, generation);
        rec.state.store(0, Ordering::Release);
        rec.generation.store(generation, Ordering::Release);
        rec.kind.store(key_kind::DISK, Ordering::Relaxed);
        rec.max_order.store(u32::from(max_order), Ordering::Relaxed);
        rec.dev.store(dev, Ordering::Relaxed);
        rec.ino.store(ino, Ordering::Relaxed);
        rec.mapping_id.store(id, Ordering::Relaxed);
        rec.root.store(0, Ordering::Relaxed);
        rec.size.store(0, Ordering::Relaxed);
        rec.serving.store(0, Ordering::Relaxed);
        rec.errseq.store(0, Ordering::Relaxed);
        rec.set_path(path);
        rec.state.store(LIVE, Ordering::Release);
        state.by_key.insert((dev, ino), record);
        Ok(Assigned {
            record,
            generation,
            mapping_id: id,
            new: true,
        })
    }

    /// Records free now.
    pub(crate) fn free_count(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .free
            .len()
    }

    /// Gives `record` back (its file left the cache: no folio is in its index any more). The
    /// next file it is given to gets a new generation.
    pub(crate) fn release(&self, record: usize) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(rec) = self.map.files().get(record) else {
            return;
        };
        let key = (
            rec.dev.load(Ordering::Acquire),
            rec.ino.load(Ordering::Acquire),
        );
        if state.by_key.get(&key) == Some(&record) {
            state.by_key.remove(&key);
        }
        rec.state.store(0, Ordering::Release);
        if !state.free.contains(&record) {
            state.free.push(record);
        }
    }

    /// The record of the file `key`, if it has one.
    pub(crate) fn find(&self, key: (u64, u64)) -> Option<usize> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.by_key.get(&key).copied()
    }

    pub(crate) fn map(&self) -> &Arc<SharedMap> {
        &self.map
    }
}
