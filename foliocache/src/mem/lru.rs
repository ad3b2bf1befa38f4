//! The reclaim lists (the kernel's per-lruvec `lists[]` of file folios): an inactive and an
//! active list, doubly linked through per-page link words, under one lock.
//!
//! Only the lists' mechanics live here: link, unlink, isolate from the tail, sizes. Which folio
//! goes where, and when, is the policy of [`crate::reclaim`].
//!
//! Protocol:
//! * A folio is on a list exactly when its `LRU` flag is set; the flag and the links change
//!   only under the lists' lock. `ACTIVE` says which list.
//! * A folio is added while the adder holds a reference (so it cannot be freed meanwhile), and
//!   the free path takes it off the lists (`free_frozen` calls [`Memory::lru_del`]): the lists
//!   hold no reference of their own, like the kernel's.
//! * Isolation (for scanning) unlinks folios from a tail, clears `LRU` and takes a speculative
//!   reference on each. A folio whose count is frozen (being freed) cannot be referenced and is
//!   simply dropped from the list: its free path finds `LRU` clear and leaves the lists alone.
//!   A scanner that keeps a folio puts it back while still holding its reference.
//!
//! The hit path never comes here: a hit sets a flag bit on the descriptor, nothing more.

use super::{FolioRef, Memory, flag};
use crate::sync::{Mutex, Ordering};

const NIL: u32 = u32::MAX;

/// Which of the two lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum List {
    Inactive = 0,
    Active = 1,
}

#[derive(Debug)]
struct Lists {
    /// Towards the tail (older), per head page.
    older: Vec<u32>,
    /// Towards the head (newer), per head page.
    newer: Vec<u32>,
    /// Most recently added, per list.
    head: [u32; 2],
    /// Least recently added, per list.
    tail: [u32; 2],
    pages: [u64; 2],
}

/// The two lists of one cache.
#[derive(Debug)]
pub(crate) struct Lru {
    lists: Mutex<Lists>,
}

/// Bytes of list links per arena page (metadata the budget counts).
pub(crate) const LINK_BYTES_PER_PAGE: usize = 2 * std::mem::size_of::<u32>();

impl Lru {
    pub(crate) fn new(pages: usize) -> Result<Self, crate::error::Error> {
        Ok(Self {
            lists: Mutex::ranked(
                crate::sync::order::Rank::Lists,
                Lists {
                    older: super::filled(pages, NIL)?,
                    newer: super::filled(pages, NIL)?,
                    head: [NIL; 2],
                    tail: [NIL; 2],
                    pages: [0; 2],
                },
            ),
        })
    }
}

impl Lists {
    fn push_head(&mut self, list: List, pfn: u32) {
        let l = list as usize;
        let old_head = self.head[l];
        self.older[pfn as usize] = old_head;
        self.newer[pfn as usize] = NIL;
        if old_head == NIL {
            self.tail[l] = pfn;
        } else {
            self.newer[old_head as usize] = pfn;
        }
        self.head[l] = pfn;
    }

    fn unlink(&mut self, list: List, pfn: u32) {
        let l = list as usize;
        let older = self.older[pfn as usize];
        let newer = self.newer[pfn as usize];
        if newer == NIL {
            self.head[l] = older;
        } else {
            self.older[newer as usize] = older;
        }
        if older == NIL {
            self.tail[l] = newer;
        } else {
            self.newer[older as usize] = newer;
        }
        self.older[pfn as usize] = NIL;
        self.newer[pfn as usize] = NIL;
    }
}

fn list_of(flags: u32) -> List {
    if flags & flag::ACTIVE != 0 {
        List::Active
    } else {
        List::Inactive
    }
}

impl Memory {
    /// Puts folios at the head of a list (one lock hold for all of them). The caller holds a
    /// reference on each. A folio already on a list stays where it is.
    pub(crate) fn lru_add(&self, folios: &[(u32, List)]) {
        if folios.is_empty() {
            return;
        }
        let mut lists = self.lru.lists.lock();
        for &(pfn, list) in folios {
            let desc = self.desc(pfn);
            let flags = desc.flags.load(Ordering::Relaxed);
            if flags & flag::LRU != 0 {
                continue;
            }
            match list {
                List::Active => desc
                    .flags
                    .fetch_or(flag::LRU | flag::ACTIVE, Ordering::Relaxed),
                List::Inactive => {
                    // A new folio has no ACTIVE bit to clear: one locked instruction, not two.
                    if flags & flag::ACTIVE != 0 {
                        desc.flags.fetch_and(!flag::ACTIVE, Ordering::Relaxed);
                    }
                    desc.flags.fetch_or(flag::LRU, Ordering::Relaxed)
                }
            };
            lists.push_head(list, pfn);
            lists.pages[list as usize] += 1u64 << desc.order.load(Ordering::Relaxed);
        }
    }

    /// Takes folio `pfn` off its list, if it is on one (the free path; removal by others).
    pub(crate) fn lru_del(&self, pfn: u32) {
        let desc = self.desc(pfn);
        if desc.flags.load(Ordering::Relaxed) & flag::LRU == 0 {
            return;
        }
        let mut lists = self.lru.lists.lock();
        // Re-check under the lock: a scanner may have isolated it meanwhile.
        let flags = desc.flags.load(Ordering::Relaxed);
        if flags & flag::LRU == 0 {
            return;
        }
        let list = list_of(flags);
        lists.unlink(list, pfn);
        lists.pages[list as usize] -= 1u64 << desc.order.load(Ordering::Relaxed);
        desc.flags.fetch_and(!flag::LRU, Ordering::Relaxed);
    }

    /// Unlinks up to `max` folios from the tail of `list` and returns the ones it could
    /// reference (the others are being freed). They are off the lists until put back.
    pub(crate) fn lru_isolate<'m>(
        &'m self,
        list: List,
        max: usize,
        out: &mut Vec<FolioRef<'m>>,
    ) -> usize {
        let mut lists = self.lru.lists.lock();
        let mut taken = 0;
        while taken < max {
            let pfn = lists.tail[list as usize];
            if pfn == NIL {
                break;
            }
            let desc = self.desc(pfn);
            lists.unlink(list, pfn);
            lists.pages[list as usize] -= 1u64 << desc.order.load(Ordering::Relaxed);
            desc.flags.fetch_and(!flag::LRU, Ordering::Relaxed);
            taken += 1;
            if let Some(folio) = self.try_get(pfn) {
                out.push(folio);
            }
        }
        taken
    }

    /// Pages on each list: (inactive, active).
    pub(crate) fn lru_pages(&self) -> (u64, u64) {
        let lists = self.lru.lists.lock();
        (lists.pages[0], lists.pages[1])
    }
}
