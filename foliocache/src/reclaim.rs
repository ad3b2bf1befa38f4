//! Reclaim: which folios leave the cache when memory runs short, and workingset detection.
//!
//! The kernel's classic scheme (`mm/vmscan.c`, `mm/swap.c`, `mm/workingset.c`), for the folios
//! of files read from storage (memory files' folios are their data and are never evicted):
//!
//! * **Two lists** (`mem::lru`), inactive and active. A folio read in goes to the head of the
//!   inactive list, or of the active list when it refaults within the working set (below).
//! * **The hit path sets a bit, nothing more** (`mark_accessed`): the first access sets
//!   REFERENCED; a second one, while the folio is inactive, sets PROMOTE. The kernel activates on
//!   that second access right away (through a per-CPU batch); here the next scan does it, in a
//!   batch under the lists' lock, so a hit never writes a shared line beyond the folio's own
//!   flags, and writes them at most twice.
//! * **Scanning** takes batches from the inactive tail. A folio in use (locked, or referenced by
//!   a reader, so its freeze fails) goes back to the head. A PROMOTE folio moves to the active
//!   list (an activation). Any other folio is evicted: frozen at the expected count, unhooked
//!   from its index, a shadow entry left in its slot, freed. A folio read once (REFERENCED only)
//!   is evicted like the kernel's unmapped page-cache folios: one access is not enough to stay.
//! * **Balance**: while the inactive list is smaller than the active list (the kernel's
//!   `inactive_is_low` for a small memory, ratio 1), folios move from the active tail to the
//!   inactive head, marked WORKINGSET. A folio hit again there is activated again.
//! * **Workingset detection** (`mm/workingset.c`): a clock, the *non-resident age*, advances by
//!   a folio's pages at every eviction and activation. The shadow entry holds the age at eviction
//!   and the folio's WORKINGSET bit. When the page is read in again (a refault), the refault
//!   distance (age now − age at eviction) is how many pages the inactive list would have needed
//!   beyond its size to keep the folio. If the distance is at most the active list's size, the
//!   folio would have stayed had the inactive list been that much bigger: it goes straight to the
//!   active list (a workingset activation), and if it was part of the working set before (its
//!   WORKINGSET bit) that is a restore. This is what lets a working set larger than the inactive
//!   list take over from a stale active list.
//! * **Shadows are bounded**: a shadow whose distance already exceeds every page of the arena
//!   can never activate anything; when shadows outnumber twice the arena's pages, a sweep drops
//!   those, so at most one shadow per arena page survives a sweep. Their index nodes count
//!   against the budget like any other.
//!
//! [`ReclaimPolicy::TwoLists`] is the same lists without the shadows; [`ReclaimPolicy::Clock`]
//! is one list with a second chance (a clock): the plain LRU approximation that a sequential
//! scan flushes.

use crate::index::MAX_VALUE;
use crate::mapping::{Mapping, RemoveError, ShadowCount};
use crate::mem::lru::List;
use crate::mem::{FolioRef, Memory, flag};
use crate::policy::ReclaimPolicy;
use crate::sync::Mutex;
use crate::sync::unmodelled::{AtomicU64, Counter, Ordering};
use std::collections::HashMap;
use std::sync::{Arc, Weak};

/// How many folios one scan step isolates from a list tail (the kernel's `SWAP_CLUSTER_MAX`).
const SCAN_BATCH: usize = 32;

/// Reclaim counters and list sizes (a snapshot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReclaimStats {
    /// Folios evicted.
    pub evicted_folios: u64,
    /// Pages evicted.
    pub evicted_pages: u64,
    /// Folios looked at by scans.
    pub scanned: u64,
    /// Folios a scan found in use (locked, or referenced by a reader) and put back.
    pub busy: u64,
    /// Times memory ran short and a scan was asked for pages.
    pub passes: u64,
    /// Folios moved to the active list after a second access.
    pub activations: u64,
    /// Folios moved from the active list to the inactive list to balance them.
    pub deactivations: u64,
    /// Folios read in again where a shadow entry said they had been evicted.
    pub refaults: u64,
    /// Refaults close enough (distance at most the active list) to go straight to the active list.
    pub workingset_activations: u64,
    /// Of those, the folios that had been in the working set before eviction.
    pub workingset_restores: u64,
    /// Shadow entries dropped by sweeps (too old to matter).
    pub shadows_dropped: u64,
    /// Shadow entries in the indexes (approximate between sweeps: a large folio that replaces
    /// several counts as one).
    pub shadow_entries: u64,
    /// Pages on the inactive list.
    pub inactive_pages: u64,
    /// Pages on the active list.
    pub active_pages: u64,
    /// The non-resident age (pages evicted plus pages activated, ever).
    pub nonresident_age: u64,
}

#[derive(Debug, Default)]
struct Counters {
    evicted_folios: Counter,
    evicted_pages: Counter,
    scanned: Counter,
    busy: Counter,
    passes: Counter,
    activations: Counter,
    deactivations: Counter,
    refaults: Counter,
    workingset_activations: Counter,
    workingset_restores: Counter,
    shadows_dropped: Counter,
}

/// A file whose folios reclaim may evict: reclaim finds its mapping through this (the file
/// state lives above reclaim, so reclaim names it only through the trait).
pub(crate) trait Evictable: Send + Sync + std::fmt::Debug {
    /// The file's mapping.
    fn mapping(&self) -> &Mapping;
}

/// One cache's reclaim state.
#[derive(Debug)]
pub(crate) struct Reclaim {
    policy: ReclaimPolicy,
    /// The arena's pages.
    total_pages: u64,
    /// Files whose folios are on the lists, by mapping id (the scan finds a folio's file here).
    files: Mutex<HashMap<u64, Weak<dyn Evictable>>>,
    /// One scan at a time: a second thread short of memory waits for the first one's result.
    scan: Mutex<()>,
    age: AtomicU64,
    shadows: Arc<ShadowCount>,
    counters: Counters,
}

/// Records an access to `folio` (a hit or a fault): sets REFERENCED, or PROMOTE if it was
/// already referenced and is inactive. A plain load when both are already where they go.
pub(crate) fn mark_accessed(folio: &FolioRef<'_>) {
    let flags = &folio.desc().flags;
    let now = flags.load(crate::sync::Ordering::Relaxed);
    if now & flag::REFERENCED == 0 {
        flags.fetch_or(flag::REFERENCED, crate::sync::Ordering::Relaxed);
    } else if now & (flag::ACTIVE | flag::PROMOTE) == 0 {
        flags.fetch_or(flag::PROMOTE, crate::sync::Ordering::Relaxed);
    }
}

/// Forgets the accesses recorded since the folio was last aged (REFERENCED and PROMOTE).
fn clear_accesses(folio: &FolioRef<'_>) {
    folio.desc().flags.fetch_and(
        !(flag::REFERENCED | flag::PROMOTE),
        crate::sync::Ordering::Relaxed,
    );
}

/// A shadow value: the age at eviction and the WORKINGSET bit.
fn pack_shadow(age: u64, workingset: bool) -> u64 {
    ((age << 1) | u64::from(workingset)) & MAX_VALUE
}

fn unpack_shadow(value: u64) -> (u64, bool) {
    (value >> 1, value & 1 == 1)
}

/// Age distance between two packed ages (the age wraps at 55 bits).
fn distance(now: u64, then: u64) -> u64 {
    now.wrapping_sub(then) & (MAX_VALUE >> 1)
}

impl Reclaim {
    pub(crate) fn new(policy: ReclaimPolicy, total_pages: u64) -> Self {
        Self {
            policy,
            total_pages,
            files: Mutex::new(HashMap::new()),
            scan: Mutex::ranked(crate::sync::order::Rank::ReclaimScan, ()),
            age: AtomicU64::new(0),
            shadows: Arc::default(),
            counters: Counters::default(),
        }
    }

    /// The shadow count the cache's mappings keep in step.
    pub(crate) fn shadow_count(&self) -> &Arc<ShadowCount> {
        &self.shadows
    }

    /// Makes a file's folios evictable (its folios can be found by mapping id).
    pub(crate) fn register(&self, mapping_id: u64, file: Weak<dyn Evictable>) {
        self.files.lock().insert(mapping_id, file);
    }

    pub(crate) fn unregister(&self, mapping_id: u64) {
        self.files.lock().remove(&mapping_id);
    }

    fn file(&self, mapping_id: u64) -> Option<Arc<dyn Evictable>> {
        self.files.lock().get(&mapping_id).and_then(Weak::upgrade)
    }

    /// Puts folios just inserted into a file (`(id, shadow it replaced)`; the caller holds a
    /// reference on each) on the lists: the inactive list, or the active one for a refault
    /// within the working set.
    pub(crate) fn add_inserted(&self, mem: &Memory, folios: &[(u32, Option<u64>)]) {
        let mut placed = Vec::with_capacity(folios.len());
        let mut active = None;
        for &(id, shadow) in folios {
            let mut list = List::Inactive;
            if let Some(value) = shadow {
                self.counters.refaults.inc();
                self.shadows.gone(1);
                if self.policy == ReclaimPolicy::Workingset {
                    let (evicted_at, workingset) = unpack_shadow(value);
                    let active_pages = *active.get_or_insert_with(|| mem.lru_pages().1);
                    let distance = distance(self.age.load(Ordering::Relaxed), evicted_at);
                    if distance <= active_pages {
                        list = List::Active;
                        self.counters.workingset_activations.inc();
                        let pages = 1u64 << mem.desc(id).order.load(crate::sync::Ordering::Relaxed);
                        self.age.fetch_add(pages, Ordering::Relaxed);
                        if workingset {
                            mem.desc(id)
                                .flags
                                .fetch_or(flag::WORKINGSET, crate::sync::Ordering::Relaxed);
                            self.counters.workingset_restores.inc();
                        }
                    }
                }
            }
            placed.push((id, list));
        }
        mem.lru_add(&placed);
    }

    /// Frees at least `want` pages if it can: scans the lists' tails, balancing them first.
    /// Returns the pages freed.
    pub(crate) fn evict(&self, mem: &Memory, want: u64) -> u64 {
        let _scan = self.scan.lock();
        self.counters.passes.inc();
        let mut freed = 0;
        let mut batch = Vec::with_capacity(SCAN_BATCH);
        // Every folio on the lists can be looked at about twice (once to activate or spare
        // it, once to evict it) before the scan gives up: busy folios do not loop forever.
        let (inactive, active) = mem.lru_pages();
        let mut budget = 2 * (inactive + active) + SCAN_BATCH as u64;
        let mut file_cache: Option<Arc<dyn Evictable>> = None;
        while freed < want && budget > 0 {
            if self.policy != ReclaimPolicy::Clock {
                self.balance(mem);
            }
            batch.clear();
            let taken = mem.lru_isolate(List::Inactive, SCAN_BATCH, &mut batch);
            if taken == 0 {
                break;
            }
            budget = budget.saturating_sub(taken as u64);
            let mut putback: Vec<(FolioRef<'_>, List)> = Vec::new();
            for folio in batch.drain(..) {
                self.counters.scanned.inc();
                let flags = folio.desc().flags.load(crate::sync::Ordering::Relaxed);
                if flags & flag::LOCKED != 0 {
                    self.counters.busy.inc();
                    putback.push((folio, List::Inactive));
                    continue;
                }
                match self.policy {
                    ReclaimPolicy::Clock => {
                        if flags & (flag::REFERENCED | flag::PROMOTE) != 0 {
                            clear_accesses(&folio);
                            putback.push((folio, List::Inactive));
                            continue;
                        }
                    }
                    ReclaimPolicy::Workingset | ReclaimPolicy::TwoLists => {
                        if flags & flag::PROMOTE != 0 {
                            clear_accesses(&folio);
                            self.counters.activations.inc();
                            self.age
                                .fetch_add(folio.nr_pages() as u64, Ordering::Relaxed);
                            putback.push((folio, List::Active));
                            continue;
                        }
                    }
                }
                match self.evict_one(mem, folio, flags, &mut file_cache) {
                    Ok(pages) => freed += pages,
                    Err(Some(folio)) => {
                        self.counters.busy.inc();
                        putback.push((folio, List::Inactive));
                    }
                    Err(None) => {}
                }
            }
            // Folios that left their file meanwhile are not put back: their last holder frees them.
            putback.retain(|(folio, _)| folio.mapping_id() != 0);
            let ids: Vec<(u32, List)> = putback.iter().map(|(f, l)| (f.id(), *l)).collect();
            mem.lru_add(&ids);
        }
        self.counters.evicted_pages.add(freed);
        if self.policy == ReclaimPolicy::Workingset && self.shadows.get() > 2 * self.total_pages {
            self.sweep_shadows();
        }
        freed
    }

    /// Moves folios from the active tail to the inactive head while the inactive list is the
    /// smaller one.
    fn balance(&self, mem: &Memory) {
        let (inactive, active) = mem.lru_pages();
        if inactive >= active {
            return;
        }
        let mut batch = Vec::with_capacity(SCAN_BATCH);
        mem.lru_isolate(List::Active, SCAN_BATCH, &mut batch);
        for folio in &batch {
            folio.set(flag::WORKINGSET);
            self.counters.deactivations.inc();
        }
        batch.retain(|folio| folio.mapping_id() != 0);
        let ids: Vec<(u32, List)> = batch.iter().map(|f| (f.id(), List::Inactive)).collect();
        mem.lru_add(&ids);
    }

    /// Evicts one isolated folio (leaving a shadow under the workingset policy). `Ok(pages)`;
    /// `Err(Some)` if it is in use; `Err(None)` if it already left its file.
    fn evict_one<'m>(
        &self,
        mem: &'m Memory,
        folio: FolioRef<'m>,
        flags: u32,
        file_cache: &mut Option<Arc<dyn Evictable>>,
    ) -> Result<u64, Option<FolioRef<'m>>> {
        let mapping_id = folio.mapping_id();
        if mapping_id == 0 {
            return Err(None);
        }
        if file_cache
            .as_ref()
            .is_none_or(|f| f.mapping().id() != mapping_id)
        {
            *file_cache = self.file(mapping_id);
        }
        let Some(file) = file_cache.as_ref() else {
            // The file is being dropped: its truncation frees the folio.
            return Err(None);
        };
        let shadow = (self.policy == ReclaimPolicy::Workingset).then(|| {
            pack_shadow(
                self.age.load(Ordering::Relaxed),
                flags & flag::WORKINGSET != 0,
            )
        });
        let pages = folio.nr_pages() as u64;
        match file.mapping().remove_folio(folio, shadow) {
            Ok(()) => {
                self.counters.evicted_folios.inc();
                self.age.fetch_add(pages, Ordering::Relaxed);
                if shadow.is_some() {
                    self.shadows.add(1);
                }
                Ok(pages)
            }
            Err(RemoveError::Busy(folio) | RemoveError::Dirty(folio)) => {
                // The same reference, handed back with the memory's lifetime rather than the
                // file's borrow.
                let pfn = folio.id();
                std::mem::forget(folio);
                Err(Some(FolioRef { mem, pfn }))
            }
            Err(_) => Err(None),
        }
    }

    /// Drops shadow entries too old to ever activate a refault (distance above the arena's
    /// pages), in every file, and recounts the rest.
    fn sweep_shadows(&self) {
        let files: Vec<Arc<dyn Evictable>> = self
            .files
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        let now = self.age.load(Ordering::Relaxed);
        let mut kept = 0u64;
        let mut dropped = 0u64;
        for file in files {
            dropped += file.mapping().drop_shadows_where(|value| {
                let (evicted_at, _) = unpack_shadow(value);
                let stale = distance(now, evicted_at) > self.total_pages;
                kept += u64::from(!stale);
                stale
            }) as u64;
        }
        self.counters.shadows_dropped.add(dropped);
        self.shadows.set(kept);
    }

    pub(crate) fn stats(&self, mem: &Memory) -> ReclaimStats {
        let c = &self.counters;
        let (inactive_pages, active_pages) = mem.lru_pages();
        ReclaimStats {
            evicted_folios: c.evicted_folios.get(),
            evicted_pages: c.evicted_pages.get(),
            scanned: c.scanned.get(),
            busy: c.busy.get(),
            passes: c.passes.get(),
            activations: c.activations.get(),
            deactivations: c.deactivations.get(),
            refaults: c.refaults.get(),
            workingset_activations: c.workingset_activations.get(),
            workingset_restores: c.workingset_restores.get(),
            shadows_dropped: c.shadows_dropped.get(),
            shadow_entries: self.shadows.get(),
            inactive_pages,
            active_pages,
            nonresident_age: self.age.load(Ordering::Relaxed),
        }
    }
}
