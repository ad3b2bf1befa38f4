//! Eviction, minimal: enough to read a file larger than the cache.
//!
//! Folios read from storage are queued in insertion order (first in, first out). When an
//! allocation for readahead finds the arena dry, the oldest folios are taken from the front
//! and removed if they are clean and idle: unlocked and referenced by nobody but
//! the cache (the removal freezes the count at exactly the cache's reference plus ours, so a
//! concurrent reader either got its reference first, and the folio is skipped, or fails its
//! speculative get and looks again). Busy folios go to the back of the queue.
//!
//! Memory files are not queued: their folios are the data (tmpfs without swap).
//!
//! The full policy (active and inactive lists, workingset shadows, a hard budget that counts
//! metadata) is issue 7's; this is the first-in, first-out floor it replaces.

use crate::file::FileInner;
use crate::mapping::RemoveError;
use crate::sync::unmodelled::Counter;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// How many queued folios one eviction pass takes off the queue at a time.
const SCAN_BATCH: usize = 64;

struct Tracked {
    file: Weak<FileInner>,
    index: u64,
    id: u32,
}

/// Eviction counters (a snapshot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReclaimStats {
    /// Folios evicted.
    pub evicted_folios: u64,
    /// Pages evicted.
    pub evicted_pages: u64,
    /// Folios looked at by eviction.
    pub scanned: u64,
    /// Folios skipped because they were in use (referenced, locked or not uptodate).
    pub busy: u64,
    /// Eviction passes (allocations that found the arena dry).
    pub passes: u64,
    /// Folios waiting in the eviction queue.
    pub queued: u64,
}

#[derive(Default)]
pub(crate) struct Reclaim {
    queue: Mutex<VecDeque<Tracked>>,
    evicted_folios: Counter,
    evicted_pages: Counter,
    scanned: Counter,
    busy: Counter,
    passes: Counter,
}

impl std::fmt::Debug for Reclaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reclaim")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Reclaim {
    /// Queues folios just inserted into `file` (`(index, id)` pairs).
    pub(crate) fn track(&self, file: &Arc<FileInner>, folios: &[(u64, u32)]) {
        if folios.is_empty() {
            return;
        }
        let weak = Arc::downgrade(file);
        let mut queue = self.lock();
        queue.extend(folios.iter().map(|&(index, id)| Tracked {
            file: weak.clone(),
            index,
            id,
        }));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Tracked>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Evicts idle folios, oldest first, until `want` pages were freed or every queued folio
    /// was looked at once. Returns the pages freed.
    pub(crate) fn evict(&self, want: u64) -> u64 {
        self.passes.inc();
        let mut freed = 0;
        let mut budget = self.lock().len();
        let mut keep = Vec::new();
        while freed < want && budget > 0 {
            let batch: Vec<Tracked> = {
                let mut queue = self.lock();
                let n = SCAN_BATCH.min(budget).min(queue.len());
                queue.drain(..n).collect()
            };
            if batch.is_empty() {
                break;
            }
            budget -= batch.len();
            let mut rest = batch.into_iter();
            for tracked in rest.by_ref() {
                self.scanned.inc();
                match evict_one(&tracked) {
                    Outcome::Freed(pages) => {
                        self.evicted_folios.inc();
                        self.evicted_pages.add(pages);
                        freed += pages;
                    }
                    Outcome::Busy => {
                        self.busy.inc();
                        keep.push(tracked);
                    }
                    Outcome::Gone => {}
                }
                if freed >= want {
                    break;
                }
            }
            keep.extend(rest);
        }
        // Busy and unexamined folios go back, at the tail (second chance for busy ones).
        if !keep.is_empty() {
            self.lock().extend(keep);
        }
        freed
    }

    /// Drops queue entries of files that are gone (the queue otherwise only shrinks when
    /// eviction runs).
    pub(crate) fn prune(&self) {
        self.lock().retain(|t| t.file.strong_count() > 0);
    }

    fn queued(&self) -> usize {
        self.lock().len()
    }

    pub(crate) fn stats(&self) -> ReclaimStats {
        ReclaimStats {
            evicted_folios: self.evicted_folios.get(),
            evicted_pages: self.evicted_pages.get(),
            scanned: self.scanned.get(),
            busy: self.busy.get(),
            passes: self.passes.get(),
            queued: self.queued() as u64,
        }
    }
}

enum Outcome {
    Freed(u64),
    Busy,
    /// No longer cached there (removed, truncated, or the file is gone): forget it.
    Gone,
}

fn evict_one(tracked: &Tracked) -> Outcome {
    let Some(file) = tracked.file.upgrade() else {
        return Outcome::Gone;
    };
    let mapping = &file.mapping;
    let Some(folio) = mapping.lookup(tracked.index) else {
        return Outcome::Gone;
    };
    if folio.id() != tracked.id {
        return Outcome::Gone;
    }
    if folio.test(crate::mem::flag::LOCKED) {
        // A read in flight (its request holds a reference too, so the freeze below would fail
        // anyway).
        return Outcome::Busy;
    }
    // The removal freezes the count at the cache's reference plus ours, or fails if a reader
    // holds one. A folio whose read failed (not uptodate, unlocked) goes too: a later read
    // retries it from the device.
    let pages = folio.nr_pages() as u64;
    match mapping.remove_folio(folio, None) {
        Ok(()) => Outcome::Freed(pages),
        Err(RemoveError::Busy(_)) => Outcome::Busy,
        Err(_) => Outcome::Gone,
    }
}
