//! Room for index nodes outside the heap: the arena of a shared cache.
//!
//! A private cache's index nodes are boxed on the heap and a slot names a child by its address.
//! A shared cache's nodes must be in the mapping every process sees, at whatever address each
//! process mapped it, so there a slot names a child by its byte offset from the start of a
//! [`NodeSpace`] (the shared cache's arena), and every offset read from a slot is checked
//! against the space before it is used (`index::Index::node_at`). `docs/SHARED.md`,
//! "Addressing: offsets, not a fixed address".

use super::NODE_ROOM;

/// Where a shared index's nodes live (see the module documentation).
pub(crate) trait NodeSpace: Send + Sync + std::fmt::Debug {
    /// The address of the space's first byte in this process.
    fn base(&self) -> usize;

    /// The space's length in bytes: every node offset is below `len() - NODE_ROOM`.
    fn len(&self) -> usize;

    /// Room for one node ([`NODE_ROOM`] bytes, 64-byte aligned): its offset, or `None` when
    /// memory is short or the space is only looked at (a client's view).
    fn alloc(&self) -> Option<usize>;

    /// Gives back the room at `offset` (a node no reader can reach any more).
    fn free(&self, offset: usize);
}

/// The nodes of a shared cache seen by a client: it walks them and allocates none.
#[derive(Debug)]
pub(crate) struct ViewOnly {
    pub(crate) base: usize,
    pub(crate) len: usize,
}

impl NodeSpace for ViewOnly {
    fn base(&self) -> usize {
        self.base
    }

    fn len(&self) -> usize {
        self.len
    }

    fn alloc(&self) -> Option<usize> {
        None
    }

    fn free(&self, _offset: usize) {}
}

/// The descriptor `mapping` of a page holding index nodes (a shared cache): never a file's id
/// (`crate::shared` gives files ids below 2^48), so a speculative lookup that lands on a node
/// page's descriptor never mistakes it for a folio, and a new owner knows node pages for what
/// they are.
#[cfg(not(loom))]
pub(crate) const NODE_PAGE: u64 = u64::MAX - 1;

/// Nodes per arena page.
#[cfg(not(loom))]
pub(crate) const PER_PAGE: usize = super::PAGE_SIZE / NODE_ROOM;

#[cfg(not(loom))]
const ALL_FREE: u8 = (1u8 << PER_PAGE) - 1;

/// The nodes of arena page `pfn` that may be handed out: all of them, except the first of page
/// 0. Its offset, 0, is an index slot's empty word (`index::node::is_node`), so it can name no
/// node: handed out, the writer that took it found "a word outside the space" and panicked
/// with the change half made (a kill storm on a small arena, where page 0 became a node page).
#[cfg(not(loom))]
fn usable(pfn: u32) -> u8 {
    if pfn == 0 { ALL_FREE & !1 } else { ALL_FREE }
}

/// The index nodes of a shared cache: room carved from arena pages taken from the allocator,
/// seven nodes to a page. Only the owner allocates and frees; a page goes back to the
/// allocator when its last node is freed (after the node's grace period, so no reader of any
/// process can still be in it).
#[cfg(not(loom))]
#[derive(Debug)]
pub(crate) struct ArenaNodes {
    map: std::sync::Arc<super::shared::SharedMap>,
    base: usize,
    len: usize,
    buddy: std::sync::Arc<super::buddy::Buddy>,
    /// The node pages and which of their nodes are free. Ranked as the private mode's node
    /// reserve: it is taken under an index's writer lock and takes the allocator's locks.
    pages: crate::sync::Mutex<NodePages>,
}

/// Node pages: for each, a bit per free node; and the pages that may have a free node.
#[cfg(not(loom))]
#[derive(Debug, Default)]
struct NodePages {
    free: std::collections::HashMap<u32, u8>,
    /// Pages with a free node, and maybe stale entries (pages since filled or given back):
    /// checked when taken.
    partial: Vec<u32>,
    /// Free pages kept for nodes ([`ArenaNodes::top_up`]): a node is allocated under an
    /// index's writer lock, where nothing can be evicted to make room, so folio allocations
    /// (which evict when the arena is dry) set these aside first, as the private cache's
    /// index reserve does. A new owner finds them free (no descriptor names them).
    spare: Vec<u32>,
}

/// Pages [`ArenaNodes::top_up`] keeps aside: 32 pages, 224 nodes, far more than one insertion
/// needs.
#[cfg(not(loom))]
const SPARE_PAGES: usize = 32;

#[cfg(not(loom))]
impl ArenaNodes {
    pub(crate) fn new(
        map: std::sync::Arc<super::shared::SharedMap>,
        buddy: std::sync::Arc<super::buddy::Buddy>,
    ) -> Self {
        let (base, pages) = map.arena();
        Self {
            map,
            base: base.as_ptr() as usize,
            len: pages * super::PAGE_SIZE,
            buddy,
            pages: crate::sync::Mutex::ranked(
                crate::sync::order::Rank::IndexReserve,
                NodePages::default(),
            ),
        }
    }
}

#[cfg(not(loom))]
impl ArenaNodes {
    /// Arena pages taken for nodes: holding nodes, or kept aside.
    pub(crate) fn held_pages(&self) -> usize {
        let pages = self.pages.lock();
        pages.free.len() + pages.spare.len()
    }

    /// Sets free pages aside for nodes, up to [`SPARE_PAGES`] (before a folio allocation,
    /// see `NodePages::spare`).
    pub(crate) fn top_up(&self) {
        let mut pages = self.pages.lock();
        while pages.spare.len() < SPARE_PAGES {
            match self.buddy.alloc(0) {
                Some(pfn) => pages.spare.push(pfn),
                None => break,
            }
        }
    }
}

#[cfg(not(loom))]
impl NodeSpace for ArenaNodes {
    fn base(&self) -> usize {
        self.base
    }

    fn len(&self) -> usize {
        self.len
    }

    fn alloc(&self) -> Option<usize> {
        let mut pages = self.pages.lock();
        let pages = &mut *pages;
        while let Some(&pfn) = pages.partial.last() {
            match pages.free.get_mut(&pfn) {
                Some(free) if *free != 0 => {
                    let slot = free.trailing_zeros() as usize;
                    *free &= !(1 << slot);
                    if *free == 0 {
                        pages.partial.pop();
                    }
                    return Some(pfn as usize * super::PAGE_SIZE + slot * NODE_ROOM);
                }
                _ => {
                    pages.partial.pop();
                }
            }
        }
        let pfn = match pages.spare.pop() {
            Some(pfn) => pfn,
            None => self.buddy.alloc(0)?,
        };
        self.map.table()[pfn as usize]
            .mapping
            .store(NODE_PAGE, std::sync::atomic::Ordering::Release);
        let usable = usable(pfn);
        let slot = usable.trailing_zeros() as usize;
        pages.free.insert(pfn, usable & !(1 << slot));
        pages.partial.push(pfn);
        Some(pfn as usize * super::PAGE_SIZE + slot * NODE_ROOM)
    }

    fn free(&self, offset: usize) {
        let pfn = (offset / super::PAGE_SIZE) as u32;
        let within = offset % super::PAGE_SIZE;
        let slot = within / NODE_ROOM;
        let mut pages = self.pages.lock();
        let pages = &mut *pages;
        let Some(free) = pages.free.get_mut(&pfn) else {
            debug_assert!(false, "free of node {offset:#x} on a page holding no nodes");
            return;
        };
        let usable = usable(pfn);
        if !within.is_multiple_of(NODE_ROOM)
            || slot >= PER_PAGE
            || usable & (1 << slot) == 0
            || *free & (1 << slot) != 0
        {
            debug_assert!(false, "bad or double free of node {offset:#x}");
            return;
        }
        if *free == 0 {
            pages.partial.push(pfn);
        }
        *free |= 1 << slot;
        if *free == usable {
            pages.free.remove(&pfn);
            self.map.table()[pfn as usize]
                .mapping
                .store(0, std::sync::atomic::Ordering::Release);
            self.buddy.free(pfn, 0);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::mem::buddy::Buddy;
    use crate::mem::refcount::RefcountPolicy;
    use crate::mem::shared::{SETTINGS_WORDS, Shape, SharedMap};
    use std::sync::Arc;

    /// Every node room of every arena page is handed out, page 0's included, and none has
    /// offset 0 (which names no node); freed again, every page goes back to the allocator.
    #[test]
    fn no_node_is_handed_out_at_offset_zero() {
        let shape = Shape {
            pages: 16,
            processes: 2,
            threads: 2,
            files: 2,
        };
        let map = Arc::new(
            SharedMap::create(
                "nodes",
                shape,
                [0; SETTINGS_WORDS],
                [3; 16],
                RefcountPolicy::FrozenBit,
                false,
            )
            .expect("create"),
        );
        let pages = map.arena().1;
        let buddy = Arc::new(Buddy::new(pages, 0).expect("buddy"));
        let nodes = ArenaNodes::new(Arc::clone(&map), Arc::clone(&buddy));
        let mut taken = Vec::new();
        while let Some(offset) = nodes.alloc() {
            taken.push(offset);
        }
        assert_eq!(buddy.free_pages(), 0);
        assert_eq!(
            taken.len(),
            pages * PER_PAGE - 1,
            "page 0 gives one node less"
        );
        assert!(taken.iter().all(|&o| o != 0), "a node at offset 0");
        assert!(
            taken.iter().any(|&o| o < super::super::PAGE_SIZE),
            "page 0 held no node"
        );
        let mut sorted = taken.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), taken.len(), "a node handed out twice");
        for offset in taken {
            nodes.free(offset);
        }
        assert_eq!(buddy.free_pages(), pages);
        assert_eq!(nodes.held_pages(), 0);
    }
}
