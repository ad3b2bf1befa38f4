//! The index: an xarray-like map from page index (`u64`) to [`Entry`] (a folio or a value).
//!
//! # Shape
//! A radix tree of 64-slot nodes (`node::Node`). The root covers `64 << root.shift` indexes and
//! grows a level when a larger index is stored; it shrinks when only its first slot holds a
//! child. Multi-order entries (a folio of order `k` covers its aligned `2^k` indexes) are stored
//! at the level `k` rounded down to a multiple of 6, in `2^(k mod 6)` slots (see the `node` module).
//!
//! # Concurrency
//! * **Readers** take no lock. They pin an epoch (the `reclaim` module), walk with acquire loads, and may
//!   see any interleaving of a concurrent writer's individual slot stores; each store leaves a
//!   slot holding a whole, valid word. Readers never see a consistent snapshot of several slots
//!   (neither do the kernel's).
//! * **Writers** (insert, remove, truncate) hold the index's writer lock ([`Index::lock`]).
//!   A new node is fully initialised before the release store that links it; an unlinked node is
//!   retired and freed only after every reader that could have reached it has unpinned.
//! * **What readers can rely on:** a node is unlinked only when it is empty, when it is the old
//!   root being replaced by its only child, or when a multi-order store covers a subtree that
//!   held only value entries. A folio entry is therefore never left behind in an unlinked node,
//!   so a [`Cursor::reload`] that still finds the folio in its slot proves the folio is (or was,
//!   at that instant) mapped at that index. That is the validation step of the speculative
//!   lookup in [`crate::mapping`].
//!
//! Folio entries carry ids, not pointers: the index never dereferences a folio and knows nothing
//! of reference counts. The mapping layer pairs it with the folio table.

pub(crate) mod node;
pub(crate) mod reclaim;

use crate::error::Error;
use crate::mem::NODE_ROOM;
use crate::mem::NodeMeter;
#[cfg(not(loom))]
use crate::mem::nodes::NodeSpace;
use crate::mem::word::Word;
use crate::sync::unmodelled::{AtomicUsize as StatUsize, Ordering as StatOrdering};
use crate::sync::{AtomicUsize, Mutex, MutexGuard, Ordering};
use node::{CHUNK, CHUNK_SHIFT, MARKS, Node, is_node};
pub use node::{Entry, MAX_VALUE};
use reclaim::{Guard, pin};
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

/// Bytes of one index node.
pub const NODE_BYTES: usize = std::mem::size_of::<Node>();

#[cfg(not(loom))]
const _: () = assert!(NODE_BYTES <= NODE_ROOM);

/// The largest order of an entry.
pub const MAX_ENTRY_ORDER: u8 = 63;

/// The lock-free-readable radix index.
#[derive(Debug)]
pub struct Index {
    /// 0 (empty tree) or the root node's word (see [`Index::node_at`]); in a shared cache it
    /// lives in the file's record, where every process reads it.
    root: Word<AtomicUsize>,
    /// Where the nodes live; with `base` and `limit`, how a slot's word names a node.
    store: NodeStore,
    /// Added to a node word to make its address: 0 for heap nodes (the word is the address).
    base: usize,
    /// The largest node word that names a node: every word read from a slot is checked against
    /// it before use (the space's end for a shared cache; no limit for heap nodes).
    limit: usize,
    writer: Mutex<()>,
    nodes: StatUsize,
    node_limit: usize,
    meter: Arc<NodeMeter>,
    /// False for a client's view of a shared index (never written by this process).
    writable: bool,
}

/// Where an index's nodes live.
#[derive(Debug)]
enum NodeStore {
    /// Boxed on the heap; a slot holds the node's address.
    Heap,
    /// In a [`NodeSpace`] (a shared cache's arena); a slot holds the node's offset in it.
    #[cfg(not(loom))]
    Space(Arc<dyn NodeSpace>),
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("shift", &self.shift).finish()
    }
}

impl Default for Index {
    fn default() -> Self {
        Self::new()
    }
}

/// The marks an entry can carry (the kernel's xarray marks, as the page cache uses them). Marks
/// are kept per node for whole subtrees, so the marked entries of a range are found without
/// visiting the unmarked ones. Only folio entries are marked, and only under the writer lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mark {
    /// The folio holds data not yet written back (`PAGECACHE_TAG_DIRTY`).
    Dirty = 0,
    /// An integrity sync must write the folio (`PAGECACHE_TAG_TOWRITE`).
    ToWrite = 1,
    /// The folio is being written back (`PAGECACHE_TAG_WRITEBACK`).
    Writeback = 2,
}

/// Why [`IndexWriter::insert_range`] stopped before inserting every entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeStop {
    /// A folio is already present at (or covering) this index.
    Present(u64),
    /// A node could not be allocated (the index's node limit).
    NoMemory,
}

/// The result of [`IndexWriter::insert_range`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeInsert {
    /// How many entries went in (a prefix of the given run).
    pub inserted: usize,
    /// What stopped the run, if it stopped early.
    pub stopped: Option<RangeStop>,
    /// The first shadow value each inserted entry replaced, if any (same order as the run).
    pub shadows: Vec<Option<u64>>,
}

impl Index {
    /// An empty index with no node limit.
    pub fn new() -> Self {
        Self::with_node_limit(usize::MAX)
    }

    /// An empty index that refuses to hold more than `limit` nodes: insertions that would need
    /// more fail with [`Error::IndexNoMemory`] (the analogue of a failed node allocation).
    pub fn with_node_limit(limit: usize) -> Self {
        Self::with_meter(limit, Arc::default())
    }

    /// An empty index whose nodes are also counted by `meter` (shared with other indexes).
    pub fn with_meter(limit: usize, meter: Arc<NodeMeter>) -> Self {
        Self {
            root: Word::Own(AtomicUsize::new(0)),
            store: NodeStore::Heap,
            base: 0,
            limit: usize::MAX,
            writer: Mutex::ranked(crate::sync::order::Rank::IndexWriter, ()),
            nodes: StatUsize::new(0),
            node_limit: limit,
            meter,
            writable: true,
        }
    }

    /// The index of file record `record` of a shared cache's mapping: its root is the
    /// record's root word, its nodes live in `space` (the tree already there, if any, is this
    /// index's), counted by `meter`. A `writable` index is the owner's: one per record in a
    /// process (a second is refused: two writers of one tree would free each other's nodes).
    /// A read-only one is a client's view, whose writer lock must never be taken.
    #[cfg(not(loom))]
    pub(crate) fn of_record(
        map: &Arc<crate::mem::shared::SharedMap>,
        record: usize,
        space: Arc<dyn NodeSpace>,
        meter: Arc<NodeMeter>,
        writable: bool,
    ) -> Result<Self, Error> {
        let rec = map.files().get(record).ok_or_else(|| {
            Error::SharedMapping(format!("no file record {record} in the mapping"))
        })?;
        let root = map.word(&rec.root);
        if writable {
            let at = std::ptr::from_ref::<AtomicUsize>(&root) as usize;
            let mut writers = SHARED_WRITERS
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if writers.contains(&at) {
                return Err(Error::SharedMapping(format!(
                    "file record {record} already has a writer in this process"
                )));
            }
            writers.push(at);
        }
        let (base, len) = (space.base(), space.len());
        Ok(Self {
            root,
            store: NodeStore::Space(space),
            base,
            limit: len.saturating_sub(NODE_ROOM),
            writer: Mutex::ranked(crate::sync::order::Rank::IndexWriter, ()),
            nodes: StatUsize::new(0),
            node_limit: usize::MAX,
            meter,
            writable,
        })
    }

    /// The node a slot's (or the root's) word names, or null for a word that names none
    /// within this index's space (a corrupted shared mapping: readers then see a hole).
    #[inline]
    pub(crate) fn node_at(&self, word: usize) -> *const Node {
        if word == 0 || word > self.limit || !word.is_multiple_of(std::mem::align_of::<Node>()) {
            return std::ptr::null();
        }
        (self.base + word) as *const Node
    }

    /// Like [`Self::node_at`] for a writer, which only follows words it wrote itself: a word
    /// that names no node means the mapping was corrupted under it, and it stops.
    fn live_node(&self, word: usize) -> &Node {
        let node = self.node_at(word);
        assert!(
            !node.is_null(),
            "index node word {word:#x} outside the node space"
        );
        // SAFETY: writers only call this under the writer lock on words read from the tree,
        // whose nodes are live until this writer retires them.
        unsafe { &*node }
    }

    /// Whether this index's nodes are in a shared space (so allocation can fail).
    fn in_shared_space(&self) -> bool {
        !matches!(self.store, NodeStore::Heap)
    }

    /// Takes the writer lock.
    pub fn lock(&self) -> IndexWriter<'_> {
        assert!(
            self.writable,
            "a client's read-only view of a shared index was locked for writing"
        );
        IndexWriter {
            index: self,
            _lock: self.writer.lock(),
            guard: pin(),
            stash: std::cell::RefCell::new(Vec::new()),
        }
    }

    /// The entry covering `index` and the slot that holds it, in one walk from the root and
    /// no other bookkeeping: the small read's lookup (`Mapping::read_optimistic`, a shared
    /// cache client's hits). `_pin` must be the pin that keeps this index's nodes alive, taken
    /// before the call: a [`ReadGuard`](crate::mem::ReadGuard) in the process that frees them,
    /// or a client's pin of its slot for a shared index (the owner frees its nodes only after
    /// every client pin caught up). `None` for a hole.
    #[inline]
    pub(crate) fn find<'p, P: crate::mem::optimistic::Pinned>(
        &'p self,
        index: u64,
        _pin: &'p P,
    ) -> Option<Found<'p>> {
        let node = self.root_node();
        if node.is_null() {
            return None;
        }
        // SAFETY: the root was loaded (acquire) under `_pin`, which outlives the borrow.
        let shift = root_shift(unsafe { &*node })?;
        let top = shift + CHUNK_SHIFT;
        if top < 64 && index >> top != 0 {
            return None;
        }
        let (node, _, offset, word) = self.walk(node, shift, index);
        let entry = Entry::decode(word)?;
        // SAFETY: `walk` returns a node reached under `_pin`, which outlives the borrow.
        let slot = &unsafe { &*node }.slots[offset];
        Some(Found {
            entry,
            first: index & !low_mask(u32::from(entry.order())),
            word,
            slot,
        })
    }

    /// Walks down from `node` (the root, or a node whose span holds `index`), whose shift is
    /// `shift`, to the slot of `index` in the lowest node on the way, under the caller's pin:
    /// that node, its shift, the slot's offset, and its word (an entry, or a hole).
    ///
    /// A child's shift is its parent's less [`CHUNK_SHIFT`] (nodes never change level: the tree
    /// grows and shrinks only at the root), so the walk never reads a node's own `shift`, which
    /// lies in the node's last cache line: on a random lookup that line is one more miss per
    /// level. A word naming no node, or a node word in a bottom node (a corrupted shared
    /// mapping may hold either), reads as a hole in the node that holds it.
    #[inline]
    fn walk(
        &self,
        mut node: *const Node,
        mut shift: u32,
        index: u64,
    ) -> (*const Node, u32, usize, usize) {
        loop {
            // SAFETY: `node` is the root or a child loaded (acquire) from a reachable node under
            // the caller's pin; nodes are freed only after every such pin ends.
            let n = unsafe { &*node };
            let offset = offset_at(shift, index);
            let word = n.slots[offset].load(Ordering::Acquire);
            if !is_node(word) {
                return (node, shift, offset, word);
            }
            let child = self.node_at(word);
            if child.is_null() || shift < CHUNK_SHIFT {
                return (node, shift, offset, 0);
            }
            node = child;
            shift -= CHUNK_SHIFT;
        }
    }

    /// Starts a lockless read.
    pub fn cursor(&self) -> Cursor<'_> {
        self.cursor_with(Some(pin()))
    }

    /// A lockless read under a pin the caller holds: `_pin` must keep this index's nodes alive
    /// (as for [`Index::find`]). A shared cache's client reads under its slot's pin, which is
    /// what holds the owner's frees back; a pin of this process's epochs would add nothing.
    pub(crate) fn cursor_under<'p, P: crate::mem::optimistic::Pinned>(
        &'p self,
        _pin: &'p P,
    ) -> Cursor<'p> {
        self.cursor_with(None)
    }

    fn cursor_with(&self, guard: Option<Guard>) -> Cursor<'_> {
        Cursor {
            index: self,
            _guard: guard,
            node: std::ptr::null(),
            shift: 0,
            offset: 0,
            at: 0,
            next: None,
            prev: None,
            walks: 0,
        }
    }

    /// The entry covering `index`, if any (one lockless walk: `Index::find`, so the index's
    /// model tests check the small read's lookup too).
    pub fn load(&self, index: u64) -> Option<Entry> {
        let pin = pin();
        self.find(index, &pin).map(|found| found.entry)
    }

    /// Collects up to `max` folio entries that are contiguous from `start` (the first must cover
    /// `start`, each next one must begin where the previous ended), in one walk. Returns the
    /// number of top-down walks it took (1, plus 1 per node boundary crossed).
    pub fn get_batch(&self, start: u64, max: usize, out: &mut Vec<(u64, Entry)>) -> u64 {
        let mut cursor = self.cursor();
        let mut entry = cursor.load(start);
        while out.len() < max {
            match entry {
                Some(e @ Entry::Folio { .. }) => out.push((cursor.first(), e)),
                _ => break,
            }
            entry = match cursor.load_next() {
                Some(e) => Some(e),
                None => break,
            };
        }
        cursor.walks()
    }

    /// The first index at or after `index` that holds no folio (empty or a value), scanning at
    /// most `max_scan` indexes. When every scanned index holds a folio it returns one past the
    /// scanned range (`index + max_scan`); 0 if that wraps (the kernel's
    /// `page_cache_next_miss` convention).
    pub fn next_miss(&self, index: u64, max_scan: u64) -> u64 {
        if max_scan == 0 {
            return index;
        }
        let end = index.checked_add(max_scan);
        let mut cursor = self.cursor();
        let mut entry = cursor.load(index);
        let mut pos = index;
        loop {
            if !matches!(entry, Some(Entry::Folio { .. })) {
                return pos;
            }
            let Some(next) = cursor.next_pos() else {
                // Folios up to the largest index: one past the range, 0 if that wraps.
                return end.unwrap_or(0);
            };
            pos = next;
            if let Some(end) = end
                && pos >= end
            {
                return end;
            }
            entry = cursor.load_next();
        }
    }

    /// The last index at or before `index` that holds no folio (empty or a value), scanning at
    /// most `max_scan` indexes. When every scanned index holds a folio it returns one before the
    /// scanned range (`index - max_scan`); `u64::MAX` if that wraps below 0 (the kernel's
    /// `page_cache_prev_miss` convention).
    pub fn prev_miss(&self, index: u64, max_scan: u64) -> u64 {
        if max_scan == 0 {
            return index;
        }
        let lowest = index.saturating_sub(max_scan - 1);
        let below = index.checked_sub(max_scan).unwrap_or(u64::MAX);
        let mut cursor = self.cursor();
        let mut entry = cursor.load(index);
        let mut pos = index;
        loop {
            if !matches!(entry, Some(Entry::Folio { .. })) {
                return pos;
            }
            let first = cursor.first();
            if first <= lowest {
                return below;
            }
            pos = first - 1;
            entry = cursor.load_prev_or_hole();
        }
    }

    /// The first index in `index..=last` covered by a folio entry, if any. Holes are skipped a
    /// whole empty slot (64^level indexes) at a time.
    pub fn next_present(&self, index: u64, last: u64) -> Option<u64> {
        let mut cursor = self.cursor();
        let mut entry = cursor.load(index);
        let mut pos = index;
        loop {
            if pos > last {
                return None;
            }
            if let Some(Entry::Folio { .. }) = entry {
                return Some(pos);
            }
            pos = cursor.next_pos()?;
            entry = cursor.load_next();
        }
    }

    /// Every entry, in index order, as (first index, entry). For tests and tools.
    pub fn entries(&self) -> Vec<(u64, Entry)> {
        let mut out = Vec::new();
        let mut cursor = self.cursor();
        let mut entry = cursor.load(0);
        loop {
            if let Some(e) = entry {
                out.push((cursor.first(), e));
            }
            if cursor.next_pos().is_none() {
                return out;
            }
            entry = cursor.load_next();
        }
    }

    /// Nodes currently linked into the tree.
    pub fn node_count(&self) -> usize {
        self.nodes.load(StatOrdering::Relaxed)
    }

    /// Bytes of index metadata (nodes) currently linked into the tree.
    pub fn memory_bytes(&self) -> usize {
        self.node_count() * NODE_BYTES
    }

    fn root_node(&self) -> *const Node {
        self.node_at(self.root.load(Ordering::Acquire))
    }
}

/// The root words of shared indexes that have their writer in this process (one each).
#[cfg(not(loom))]
static SHARED_WRITERS: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

impl Drop for Index {
    fn drop(&mut self) {
        #[cfg(not(loom))]
        if self.writable && self.in_shared_space() {
            let at = std::ptr::from_ref::<AtomicUsize>(&self.root) as usize;
            SHARED_WRITERS
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .retain(|&w| w != at);
        }
        let root = self.root.load(Ordering::Relaxed);
        if root == 0 {
            return;
        }
        match &self.store {
            NodeStore::Heap => {
                // SAFETY: `&mut self`: no reader or writer can be inside the tree; every linked
                // node came from `Box::into_raw` and is reachable exactly once from the root.
                let freed = unsafe { free_subtree(root as *mut Node) };
                self.meter.credit(freed * NODE_BYTES);
            }
            // A shared tree outlives this process's view of it: the owner drops a file's tree
            // explicitly (`IndexWriter::clear`), a client's view never does.
            #[cfg(not(loom))]
            NodeStore::Space(_) => {}
        }
    }
}

/// Frees a subtree immediately.
///
/// # Safety
/// The subtree must be unreachable by anyone else and made of `Box::into_raw` nodes.
/// Returns the number of nodes freed.
unsafe fn free_subtree(node: *mut Node) -> usize {
    // SAFETY: the caller owns the subtree exclusively.
    let boxed = unsafe { Box::from_raw(node) };
    let mut freed = 1;
    for slot in &boxed.slots {
        let word = slot.load(Ordering::Relaxed);
        if is_node(word) {
            // SAFETY: a child of an exclusively owned subtree is exclusively owned too.
            freed += unsafe { free_subtree(word as *mut Node) };
        }
    }
    freed
}

/// A lockless reader's position in the index (the `xa_state` of a reader).
///
/// It holds an epoch pin: nodes it reached stay allocated while it lives. Drop it promptly,
/// and never hold it across anything that blocks for long.
pub struct Cursor<'a> {
    index: &'a Index,
    /// The pin it took, or none when made under the caller's ([`Index::cursor_under`]).
    _guard: Option<Guard>,
    /// The node holding the slot last loaded (null when the last load found no node).
    node: *const Node,
    /// That node's shift (known from the walk; the node's own field is not read).
    shift: u32,
    offset: usize,
    /// The index last asked for.
    at: u64,
    /// One past the range the last load covered (entry or hole); None if that wraps.
    next: Option<u64>,
    /// First index of the range the last load covered, minus one; None if it started at 0.
    prev: Option<u64>,
    walks: u64,
}

impl Cursor<'_> {
    /// Walks from the root to `index` and returns its entry.
    pub fn load(&mut self, index: u64) -> Option<Entry> {
        self.walks += 1;
        self.at = index;
        let root = self.index.root_node();
        if root.is_null() {
            return self.hole_to_end(index);
        }
        // SAFETY: the root was loaded (acquire) during this cursor's pin.
        let Some(shift) = root_shift(unsafe { &*root }) else {
            return self.hole_to_end(index);
        };
        let top = shift + CHUNK_SHIFT;
        if top < 64 && index >> top != 0 {
            // Beyond the root's span: nothing is stored from the span's end on.
            self.hole_to_end(index);
            self.prev = Some((1u64 << top) - 1);
            return None;
        }
        self.descend(root, shift, index)
    }

    /// Records that nothing is stored at `index` or after it.
    fn hole_to_end(&mut self, index: u64) -> Option<Entry> {
        self.node = std::ptr::null();
        self.prev = index.checked_sub(1);
        self.next = None;
        None
    }

    /// Re-reads the slot of the last load, without walking. A folio entry found again proves the
    /// folio was still mapped there at this moment (see the module documentation).
    pub fn reload(&self) -> Option<Entry> {
        if self.node.is_null() {
            return None;
        }
        // SAFETY: `node` was reached during this cursor's pin, which is still held, so it has
        // not been freed (retired nodes outlive every pin taken before their retirement).
        let node = unsafe { &*self.node };
        Entry::decode(node.slots[self.offset].load(Ordering::Acquire))
    }

    /// The first index of the entry (or hole) the last load landed in.
    pub fn first(&self) -> u64 {
        self.prev.map_or(0, |p| p + 1)
    }

    /// One past the range of the last load (None if that wraps past the largest index).
    pub fn next_pos(&self) -> Option<u64> {
        self.next
    }

    /// Top-down walks done so far.
    pub fn walks(&self) -> u64 {
        self.walks
    }

    /// Loads the entry (or hole: `None`) right after the last one: staying inside the current
    /// node when it can, walking from the root only when the next index lies in another node.
    /// `None` also when the last one reached the largest index.
    pub fn load_next(&mut self) -> Option<Entry> {
        let index = self.next?;
        self.load_near(index)
    }

    /// The entry right after the last one loaded, when both lie in the same leaf: one slot
    /// load, no walk, and the cursor stays where it is. `None` when the next index lies in
    /// another node, or the last load did not end in a leaf (entries of order 6 and more).
    /// A hint, for a prefetch: the slot may change right after, so nothing may be concluded
    /// from it without a proper load.
    pub(crate) fn peek_next(&self) -> Option<Entry> {
        let index = self.next?;
        if self.node.is_null() || self.shift != 0 || !same_span(0, self.at, index) {
            return None;
        }
        // SAFETY: reached during this cursor's pin (see `reload`).
        let node = unsafe { &*self.node };
        let word = node.slots[offset_at(0, index)].load(Ordering::Relaxed);
        // A node word in a leaf is corruption (a shared mapping's), read as a hole.
        if is_node(word) {
            return None;
        }
        Entry::decode(word)
    }

    /// Moves to the first entry after the last one loaded, at most up to index `last`, that
    /// `wanted` accepts, and returns its first index; `None` when there is none up to `last`
    /// (the cursor is then left on no node). Like repeated [`Cursor::load_next`], but the rest
    /// of a leaf is scanned in place, one load per slot and no walk, so passing over a long
    /// run of entries the caller does not want (a memory file's zeros folios) costs a tight
    /// loop per leaf instead of a load and decode through the cursor per entry.
    pub fn seek(&mut self, last: u64, wanted: impl Fn(Entry) -> bool) -> Option<u64> {
        const LEAF_MASK: u64 = CHUNK as u64 - 1;
        loop {
            let Some(index) = self.next.filter(|&next| next <= last) else {
                self.node = std::ptr::null();
                return None;
            };
            if !self.node.is_null() {
                // SAFETY: reached during this cursor's pin (see `reload`).
                let node = unsafe { &*self.node };
                if self.shift == 0 && same_span(0, self.at, index) {
                    let leaf_end = index | LEAF_MASK;
                    let stop = offset_at(0, leaf_end.min(last));
                    let found = (offset_at(0, index)..=stop).find(|&offset| {
                        Entry::decode(node.slots[offset].load(Ordering::Acquire))
                            .is_some_and(&wanted)
                    });
                    if let Some(offset) = found {
                        // Load it properly (it may have changed since the scan looked).
                        let at = (index & !LEAF_MASK) | offset as u64;
                        if self.descend(self.node, 0, at).is_some_and(&wanted) {
                            return Some(self.first());
                        }
                        continue;
                    }
                    // Nothing wanted in the rest of this leaf: on to the next index after it.
                    self.at = leaf_end;
                    self.next = leaf_end.checked_add(1);
                    continue;
                }
            }
            if self.load_near(index).is_some_and(&wanted) {
                return Some(self.first());
            }
        }
    }

    fn load_prev_or_hole(&mut self) -> Option<Entry> {
        let index = self.prev?;
        self.load_near(index)
    }

    /// Loads `index`, starting from the current node if `index` lies in its span.
    fn load_near(&mut self, index: u64) -> Option<Entry> {
        if !self.node.is_null() && same_span(self.shift, self.at, index) {
            return self.descend(self.node, self.shift, index);
        }
        self.load(index)
    }

    /// Walks down from `node` (of `shift`), whose span contains `index`.
    fn descend(&mut self, node: *const Node, shift: u32, index: u64) -> Option<Entry> {
        self.at = index;
        let (node, shift, offset, word) = self.index.walk(node, shift, index);
        let Some(entry) = Entry::decode(word) else {
            return self.hole(node, shift, offset, index);
        };
        self.node = node;
        self.shift = shift;
        self.offset = offset;
        let order = u32::from(entry.order());
        let mask = low_mask(order);
        let first = index & !mask;
        self.prev = first.checked_sub(1);
        self.next = (first | mask).checked_add(1);
        Some(entry)
    }

    /// Records an empty slot of `node` (of `shift`: the slot covers `2^shift` indexes around
    /// `index`).
    fn hole(&mut self, node: *const Node, shift: u32, offset: usize, index: u64) -> Option<Entry> {
        self.node = node;
        self.shift = shift;
        self.offset = offset;
        let mask = low_mask(shift);
        let first = index & !mask;
        self.prev = first.checked_sub(1);
        self.next = (first | mask).checked_add(1);
        None
    }
}

/// What [`Index::find`] found: the entry, the first index it covers, and its slot.
pub(crate) struct Found<'p> {
    pub(crate) entry: Entry,
    pub(crate) first: u64,
    word: usize,
    slot: &'p AtomicUsize,
}

impl Found<'_> {
    /// Whether the slot still holds the very word the walk found (acquire): for a folio, proof
    /// that it was still mapped there at this moment (as [`Cursor::reload`]).
    #[inline]
    pub(crate) fn still_there(&self) -> bool {
        self.slot.load(Ordering::Acquire) == self.word
    }
}

/// The shift of a root node, as the walks take it: `None` for one too large to shift by,
/// which only a corrupted shared mapping can show; the walk then finds nothing. (One that is
/// not a multiple of [`CHUNK_SHIFT`] is as corrupt, but harmless: the walk stops at the first
/// level below [`CHUNK_SHIFT`].)
#[inline]
fn root_shift(root: &Node) -> Option<u32> {
    let shift = u32::from(root.shift);
    (shift < 64).then_some(shift)
}

/// The slot of `index` in a node of `shift`.
#[inline]
fn offset_at(shift: u32, index: u64) -> usize {
    ((index >> shift) as usize) & (CHUNK - 1)
}

/// Whether `a` and `b` lie in the span of one node of `shift`.
#[inline]
fn same_span(shift: u32, a: u64, b: u64) -> bool {
    let top = shift + CHUNK_SHIFT;
    top >= 64 || a >> top == b >> top
}

fn low_mask(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

/// Read-only access to an [`Index`]: lockless lookups, batches, misses and listings, but no
/// writer. A [`Mapping`](crate::raw::Mapping) hands out this view of its index, because its folios'
/// references must change together with the index.
#[derive(Debug, Clone, Copy)]
pub struct IndexView<'a>(&'a Index);

impl<'a> IndexView<'a> {
    pub(crate) fn new(index: &'a Index) -> Self {
        Self(index)
    }

    /// See [`Index::load`].
    pub fn load(&self, index: u64) -> Option<Entry> {
        self.0.load(index)
    }

    /// See [`Index::cursor`].
    pub fn cursor(&self) -> Cursor<'a> {
        self.0.cursor()
    }

    /// See [`Index::get_batch`].
    pub fn get_batch(&self, start: u64, max: usize, out: &mut Vec<(u64, Entry)>) -> u64 {
        self.0.get_batch(start, max, out)
    }

    /// See [`Index::next_miss`].
    pub fn next_miss(&self, index: u64, max_scan: u64) -> u64 {
        self.0.next_miss(index, max_scan)
    }

    /// See [`Index::prev_miss`].
    pub fn prev_miss(&self, index: u64, max_scan: u64) -> u64 {
        self.0.prev_miss(index, max_scan)
    }

    /// See [`Index::next_present`].
    pub fn next_present(&self, index: u64, last: u64) -> Option<u64> {
        self.0.next_present(index, last)
    }

    /// See [`Index::entries`].
    pub fn entries(&self) -> Vec<(u64, Entry)> {
        self.0.entries()
    }

    /// See [`Index::node_count`].
    pub fn node_count(&self) -> usize {
        self.0.node_count()
    }

    /// See [`Index::memory_bytes`].
    pub fn memory_bytes(&self) -> usize {
        self.0.memory_bytes()
    }
}

/// The index's writer: holds the writer lock (and an epoch pin to retire nodes).
pub struct IndexWriter<'a> {
    index: &'a Index,
    _lock: MutexGuard<'a, ()>,
    guard: Guard,
    /// Nodes of a shared space allocated ahead of a change (`reserve`), not yet linked.
    stash: std::cell::RefCell<Vec<usize>>,
}

impl Drop for IndexWriter<'_> {
    /// Nodes stashed for a change that needed fewer go straight back: no reader ever saw them.
    fn drop(&mut self) {
        #[cfg(not(loom))]
        if let NodeStore::Space(space) = &self.index.store {
            for word in self.stash.get_mut().drain(..) {
                space.free(word);
            }
        }
    }
}

/// What a conflict scan found in the range of a new entry.
enum Scan {
    /// The range holds no folio; the first value found, if any.
    Clear(Option<u64>),
    /// A folio covers this index.
    Conflict(u64),
}

impl IndexWriter<'_> {
    /// The entry covering `index` (a lockless read is fine too; this is for convenience).
    pub fn load(&self, index: u64) -> Option<Entry> {
        self.index.load(index)
    }

    /// Stores `entry` at `index` (which must be aligned to the entry's order). Values in the
    /// range are overwritten (a larger value covering it is split around it) and the first one
    /// is returned; a folio anywhere in the range makes it fail with [`Error::Exists`] and
    /// change nothing.
    pub fn insert(&mut self, index: u64, entry: Entry) -> Result<Option<u64>, Error> {
        let order = entry.order();
        check_range(index, order)?;
        if let Entry::Value { value, .. } = entry
            && value > MAX_VALUE
        {
            return Err(Error::ValueTooLarge { value });
        }
        let last = index | low_mask(u32::from(order));
        let level = order / CHUNK_SHIFT as u8 * CHUNK_SHIFT as u8;
        self.reserve(index, last, level)?;
        self.grow(last, level);
        match self.scan(index, order, level) {
            Scan::Conflict(at) => {
                self.shrink();
                Err(Error::Exists { index: at })
            }
            Scan::Clear(shadow) => {
                self.store(index, entry, level);
                Ok(shadow)
            }
        }
    }

    /// Inserts a run of entries at consecutive positions from `start` (each at the index where
    /// the previous one ended), under this one lock hold. Stops at the first entry whose range
    /// holds a folio or that needs a node the limit forbids; what went in stays in.
    pub fn insert_range(&mut self, start: u64, entries: &[Entry]) -> Result<RangeInsert, Error> {
        // Validate the whole run first: a misaligned or overflowing run is a caller bug and
        // must not be half inserted.
        check_run(start, entries)?;
        let mut result = RangeInsert {
            inserted: 0,
            stopped: None,
            shadows: Vec::with_capacity(entries.len()),
        };
        let mut index = start;
        // The bottom node the previous entry went into: the next entries that fall in it and
        // find their slots empty are stored straight there, with no walk from the root (the
        // case that matters: a readahead window of single pages, 64 per bottom node).
        let mut leaf: Option<(&Node, u64)> = None;
        for entry in entries {
            if let Some((node, base)) = leaf
                && self.store_in_leaf(node, base, index, *entry)
            {
                result.inserted += 1;
                result.shadows.push(None);
                index = index.wrapping_add(1u64 << entry.order());
                continue;
            }
            match self.insert(index, *entry) {
                Ok(shadow) => {
                    result.inserted += 1;
                    result.shadows.push(shadow);
                    leaf = self.leaf(index);
                }
                Err(Error::Exists { index: at }) => {
                    result.stopped = Some(RangeStop::Present(at));
                    break;
                }
                Err(Error::IndexNoMemory) => {
                    result.stopped = Some(RangeStop::NoMemory);
                    break;
                }
                Err(other) => return Err(other),
            }
            index = index.wrapping_add(1u64 << entry.order());
        }
        Ok(result)
    }

    /// The bottom node (shift 0) holding `index` and the first index it covers, if the tree
    /// reaches down to one there.
    fn leaf(&self, index: u64) -> Option<(&Node, u64)> {
        let mut node = self.index.root_node();
        loop {
            if node.is_null() {
                return None;
            }
            // SAFETY: nodes reachable from the root are live under the writer lock, which this
            // writer holds for as long as the returned borrow of `self` lasts (nodes are only
            // retired by writers).
            let n = unsafe { &*node };
            if n.shift == 0 {
                return Some((n, node_base(n, index)));
            }
            let word = n.slots[n.offset(index)].load(Ordering::Relaxed);
            if !is_node(word) {
                return None;
            }
            node = self.index.live_node(word);
        }
    }

    /// Stores `entry` at `index` in the bottom node `node` (covering `base..base + 64`) if it
    /// lies wholly inside it and its slots are all empty (no folio, no value to split or
    /// report). Returns whether it did. The node is still in the tree: under the writer lock
    /// only this writer changes it, and a successful insert never removes a node.
    fn store_in_leaf(&self, node: &Node, base: u64, index: u64, entry: Entry) -> bool {
        let order = u32::from(entry.order());
        if order >= CHUNK_SHIFT || index & !low_mask(CHUNK_SHIFT) != base {
            return false;
        }
        let (first, span) = group(node, index, entry.order());
        let slots = &node.slots[first..first + span];
        if slots.iter().any(|slot| slot.load(Ordering::Relaxed) != 0) {
            return false;
        }
        let word = entry.encode();
        for slot in slots {
            slot.store(word, Ordering::Release);
        }
        // Slot counts are only written under the writer lock.
        let count = node.count.load(StatOrdering::Relaxed);
        node.count.store(count + span as u16, StatOrdering::Relaxed);
        true
    }

    /// Removes the entry covering `index` and returns it. With `expected`, removes only if the
    /// entry is exactly that. With `shadow`, leaves a value entry of the same order in its place.
    pub fn remove(
        &mut self,
        index: u64,
        expected: Option<Entry>,
        shadow: Option<u64>,
    ) -> Result<Option<Entry>, Error> {
        if let Some(value) = shadow
            && value > MAX_VALUE
        {
            return Err(Error::ValueTooLarge { value });
        }
        let mut path: Vec<(*const Node, usize)> = Vec::with_capacity(12);
        let mut node = self.index.root_node();
        let (found, holder) = loop {
            if node.is_null() {
                return Ok(None);
            }
            // SAFETY: under the writer lock every node reachable from the root is live.
            let n = unsafe { &*node };
            let top = u32::from(n.shift) + CHUNK_SHIFT;
            if path.is_empty() && top < 64 && index >> top != 0 {
                return Ok(None);
            }
            let offset = n.offset(index);
            let word = n.slots[offset].load(Ordering::Relaxed);
            if is_node(word) {
                path.push((node, offset));
                node = self.index.live_node(word);
                continue;
            }
            match Entry::decode(word) {
                None => return Ok(None),
                Some(entry) => break (entry, n),
            }
        };
        if expected.is_some_and(|e| e != found) {
            return Ok(None);
        }
        let order = found.order();
        let (first_slot, span) = group(holder, index, order);
        let replacement = shadow.map_or(0, |value| Entry::Value { value, order }.encode());
        for slot in &holder.slots[first_slot..first_slot + span] {
            slot.store(replacement, Ordering::Release);
        }
        let was = holder.clear_slot_marks(first_slot);
        unmark_path(&path, holder, was);
        if replacement == 0 {
            holder.count.fetch_sub(span as u16, StatOrdering::Relaxed);
            self.prune(path, holder);
        }
        self.shrink();
        Ok(Some(found))
    }

    /// The entry covering `index`: the path down to its node (parents first), the node, the
    /// first slot of its group, and the entry.
    #[allow(clippy::type_complexity)]
    fn locate(&self, index: u64) -> Option<(Vec<(*const Node, usize)>, &Node, usize, Entry)> {
        let mut path: Vec<(*const Node, usize)> = Vec::with_capacity(12);
        let mut node = self.index.root_node();
        loop {
            if node.is_null() {
                return None;
            }
            // SAFETY: under the writer lock (held for the borrow of `self`) every node
            // reachable from the root is live.
            let n = unsafe { &*node };
            let top = u32::from(n.shift) + CHUNK_SHIFT;
            if path.is_empty() && top < 64 && index >> top != 0 {
                return None;
            }
            let offset = n.offset(index);
            let word = n.slots[offset].load(Ordering::Relaxed);
            if is_node(word) {
                path.push((node, offset));
                node = self.index.live_node(word);
                continue;
            }
            let entry = Entry::decode(word)?;
            let (first_slot, _) = group(n, index, entry.order());
            return Some((path, n, first_slot, entry));
        }
    }

    /// Checks the tree's own bookkeeping (for tests): every node's count of used slots, and
    /// that a mark bit is set exactly where it leads to a marked entry: on the first slot of
    /// a folio entry's group, or on a child with that mark somewhere below.
    pub fn check_invariants(&self) -> Result<(), String> {
        let root = self.index.root_node();
        if root.is_null() {
            return Ok(());
        }
        // SAFETY: live under the writer lock.
        check_node(self.index, unsafe { &*root })
    }

    /// Sets `mark` on the folio entry covering `index`; returns whether there is one.
    pub fn set_mark(&mut self, index: u64, mark: Mark) -> bool {
        let Some((path, node, slot, entry)) = self.locate(index) else {
            return false;
        };
        if !entry.is_folio() {
            return false;
        }
        let m = mark as usize;
        if node.set_mark_bit(m, slot, true) != 0 {
            return true; // the ancestors already lead here
        }
        for &(parent, offset) in path.iter().rev() {
            // SAFETY: walked under the writer lock, still held.
            let p = unsafe { &*parent };
            if p.set_mark_bit(m, offset, true) != 0 {
                break;
            }
        }
        true
    }

    /// Clears `mark` from the entry covering `index`; returns whether it was set.
    pub fn clear_mark(&mut self, index: u64, mark: Mark) -> bool {
        let Some((path, node, slot, _)) = self.locate(index) else {
            return false;
        };
        let m = mark as usize;
        let was = node.set_mark_bit(m, slot, false) & (1 << slot) != 0;
        if was {
            let mut cleared = [false; MARKS];
            cleared[m] = true;
            unmark_path(&path, node, cleared);
        }
        was
    }

    /// Whether the entry covering `index` carries `mark`.
    pub fn get_mark(&self, index: u64, mark: Mark) -> bool {
        self.locate(index)
            .is_some_and(|(_, node, slot, _)| node.mark_bits(mark as usize) & (1 << slot) != 0)
    }

    /// The first entry carrying `mark` that covers an index in `from..=last`, as (first
    /// index, entry), found through the nodes' marks (unmarked subtrees are not visited).
    pub fn next_marked(&self, from: u64, last: u64, mark: Mark) -> Option<(u64, Entry)> {
        let root = self.index.root_node();
        if root.is_null() || from > last {
            return None;
        }
        // SAFETY: live under the writer lock.
        next_marked_in(self.index, unsafe { &*root }, 0, from, last, mark as usize)
    }

    /// Replaces the entry `old` covering `index` with `new`, of the same order, in place: a
    /// lockless reader sees one or the other, never a hole. Returns whether `old` was found.
    pub fn replace(&mut self, index: u64, old: Entry, new: Entry) -> Result<bool, Error> {
        if old.order() != new.order() {
            return Err(Error::OrderMismatch {
                old: old.order(),
                new: new.order(),
            });
        }
        if let Entry::Value { value, .. } = new
            && value > MAX_VALUE
        {
            return Err(Error::ValueTooLarge { value });
        }
        let mut node = self.index.root_node();
        loop {
            if node.is_null() {
                return Ok(false);
            }
            // SAFETY: under the writer lock every node reachable from the root is live.
            let n = unsafe { &*node };
            let top = u32::from(n.shift) + CHUNK_SHIFT;
            if std::ptr::eq(node, self.index.root_node()) && top < 64 && index >> top != 0 {
                return Ok(false);
            }
            let word = n.slots[n.offset(index)].load(Ordering::Relaxed);
            if is_node(word) {
                node = self.index.live_node(word);
                continue;
            }
            if Entry::decode(word) != Some(old) {
                return Ok(false);
            }
            let (first_slot, span) = group(n, index, old.order());
            let new = new.encode();
            for slot in &n.slots[first_slot..first_slot + span] {
                slot.store(new, Ordering::Release);
            }
            return Ok(true);
        }
    }

    /// Removes every entry lying entirely inside `range` and returns them as (first index,
    /// entry). Entries straddling either end are left in place.
    pub fn truncate(&mut self, range: impl RangeBounds<u64>) -> Vec<(u64, Entry)> {
        let mut out = Vec::new();
        self.truncate_where(range, |first, entry| {
            out.push((first, entry));
            true
        });
        out
    }

    /// Removes the entries lying entirely inside `range` for which `remove(first index, entry)`
    /// says true (it is asked once per entry, in index order); returns how many went.
    pub fn truncate_where(
        &mut self,
        range: impl RangeBounds<u64>,
        mut remove: impl FnMut(u64, Entry) -> bool,
    ) -> usize {
        let first = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => match s.checked_add(1) {
                Some(s) => s,
                None => return 0,
            },
            Bound::Unbounded => 0,
        };
        let last = match range.end_bound() {
            Bound::Included(&e) => e,
            Bound::Excluded(&e) => match e.checked_sub(1) {
                Some(e) => e,
                None => return 0,
            },
            Bound::Unbounded => u64::MAX,
        };
        if first > last {
            return 0;
        }
        let root = self.index.root_node();
        if root.is_null() {
            return 0;
        }
        let mut removed = 0;
        // SAFETY: under the writer lock the root is live.
        self.truncate_node(unsafe { &*root }, 0, first, last, &mut |at, entry| {
            let go = remove(at, entry);
            removed += usize::from(go);
            go
        });
        // SAFETY: as above.
        if unsafe { &*root }.count.load(StatOrdering::Relaxed) == 0 {
            let word = self.index.root.swap(0, Ordering::AcqRel);
            self.retire(word);
        }
        self.shrink();
        removed
    }

    fn truncate_node(
        &self,
        node: &Node,
        base: u64,
        first: u64,
        last: u64,
        remove: &mut dyn FnMut(u64, Entry) -> bool,
    ) {
        let shift = u32::from(node.shift);
        let mut offset = 0;
        while offset < CHUNK {
            let Some(slot_first) = slot_start(base, offset, shift) else {
                break; // past the largest index (only in a root of shift 60)
            };
            let slot_last = slot_first | low_mask(shift);
            if slot_last < first {
                offset += 1;
                continue;
            }
            if slot_first > last {
                break;
            }
            let word = node.slots[offset].load(Ordering::Relaxed);
            if is_node(word) {
                // SAFETY: a child of a live node, under the writer lock.
                let child = self.index.live_node(word);
                self.truncate_node(child, slot_first, first, last, remove);
                for m in 0..MARKS {
                    if child.mark_bits(m) == 0 {
                        node.set_mark_bit(m, offset, false);
                    }
                }
                if child.count.load(StatOrdering::Relaxed) == 0 {
                    node.slots[offset].store(0, Ordering::Release);
                    node.count.fetch_sub(1, StatOrdering::Relaxed);
                    self.retire(word);
                }
                offset += 1;
                continue;
            }
            let Some(entry) = Entry::decode(word) else {
                offset += 1;
                continue;
            };
            let order = u32::from(entry.order());
            let entry_first = slot_first & !low_mask(order);
            let entry_last = entry_first | low_mask(order);
            let (first_slot, span) = group(node, entry_first, entry.order());
            if entry_first >= first && entry_last <= last && remove(entry_first, entry) {
                for slot in &node.slots[first_slot..first_slot + span] {
                    slot.store(0, Ordering::Release);
                }
                node.clear_slot_marks(first_slot);
                node.count.fetch_sub(span as u16, StatOrdering::Relaxed);
            }
            offset = first_slot + span;
        }
    }

    /// Fails, before changing anything, if storing an entry at `index` (ending at `last`) on
    /// `level` would need more nodes than the index's limit allows.
    /// In a shared space it also allocates those nodes now, into the writer's stash: the
    /// change that follows then cannot fail half done for want of memory.
    fn reserve(&self, index: u64, last: u64, level: u8) -> Result<(), Error> {
        if self.index.in_shared_space() {
            return self.stash_nodes(self.nodes_needed(index, last, level));
        }
        if self.index.node_limit == usize::MAX {
            return Ok(());
        }
        if self.index.node_count() + self.nodes_needed(index, last, level) > self.index.node_limit {
            return Err(Error::IndexNoMemory);
        }
        Ok(())
    }

    /// Makes the stash hold at least `needed` nodes of the shared space.
    fn stash_nodes(&self, needed: usize) -> Result<(), Error> {
        #[cfg(not(loom))]
        if let NodeStore::Space(space) = &self.index.store {
            let mut stash = self.stash.borrow_mut();
            while stash.len() < needed {
                stash.push(space.alloc().ok_or(Error::IndexNoMemory)?);
            }
        }
        #[cfg(loom)]
        let _ = needed;
        Ok(())
    }

    /// How many nodes `grow` + `store` will allocate for this entry (value splits included).
    fn nodes_needed(&self, index: u64, last: u64, level: u8) -> usize {
        let levels = |from: u8| usize::from((from - level) / CHUNK_SHIFT as u8);
        let top = height_for(last).max(level);
        let root = self.index.root_node();
        if root.is_null() {
            return levels(top) + 1;
        }
        // SAFETY: live under the writer lock.
        let mut node = unsafe { &*root };
        let mut needed = 0;
        if top > node.shift {
            // New roots at node.shift + 6 ..= top, chained through their slot 0. The path to
            // `index` follows that chain down to the old root unless it leaves it on the way.
            needed += usize::from((top - node.shift) / CHUNK_SHIFT as u8);
            let leave = (node.shift + CHUNK_SHIFT as u8..=top)
                .rev()
                .step_by(CHUNK_SHIFT as usize)
                .find(|&shift| (index >> shift) & (CHUNK as u64 - 1) != 0);
            if let Some(shift) = leave {
                return needed + levels(shift);
            }
        }
        while node.shift > level {
            let word = node.slots[node.offset(index)].load(Ordering::Relaxed);
            if !is_node(word) {
                // Empty (or a value to split): one new node per level below.
                return needed + levels(node.shift);
            }
            // SAFETY: a child of a live node, under the writer lock.
            node = self.index.live_node(word);
        }
        needed
    }

    /// A new, empty node at `shift`: its address and the word that names it in a slot. Nodes in
    /// a shared space come from the writer's stash, filled by `reserve` before the change began
    /// (so a change never fails half done).
    fn new_node(&self, shift: u8) -> (*mut Node, usize) {
        self.index.nodes.fetch_add(1, StatOrdering::Relaxed);
        self.index.meter.charge(NODE_BYTES);
        match &self.index.store {
            NodeStore::Heap => {
                let node = Box::into_raw(Box::new(Node::new(shift)));
                (node, node as usize)
            }
            #[cfg(not(loom))]
            NodeStore::Space(_) => {
                let word = self
                    .stash
                    .borrow_mut()
                    .pop()
                    .expect("reserve() stashed every node this change needs");
                let node = self.index.node_at(word).cast_mut();
                assert!(!node.is_null(), "the space handed out a word outside it");
                // SAFETY: the space handed this room to this writer alone (it is in no tree and
                // no reader can reach it), it lies inside the space (checked above) and is
                // aligned for a node (`NodeSpace::alloc`).
                unsafe { node.write(Node::new(shift)) };
                (node, word)
            }
        }
    }

    /// Frees the node `word` names once no reader can still reach it. Callers pass a node they
    /// have just unlinked (no new reader can reach it) and retire each node once.
    fn retire(&self, word: usize) {
        self.index.nodes.fetch_sub(1, StatOrdering::Relaxed);
        match &self.index.store {
            NodeStore::Heap => {
                // SAFETY: heap words are `Box::into_raw` addresses; see above for the rest.
                unsafe {
                    reclaim::retire(
                        &self.guard,
                        word as *mut Node,
                        Arc::clone(&self.index.meter),
                    );
                };
            }
            #[cfg(not(loom))]
            NodeStore::Space(space) => {
                reclaim::retire_in_space(
                    &self.guard,
                    word,
                    Arc::clone(space),
                    Arc::clone(&self.index.meter),
                );
            }
        }
    }

    /// Retires a whole unlinked subtree (which holds no folio).
    fn retire_subtree(&self, word: usize) {
        let n = self.index.live_node(word);
        for slot in &n.slots {
            let child = slot.load(Ordering::Relaxed);
            if is_node(child) {
                self.retire_subtree(child);
            }
        }
        self.retire(word);
    }

    /// Grows the tree until the root covers `last` and sits at least at `level`.
    fn grow(&self, last: u64, level: u8) {
        let needed = height_for(last).max(level);
        let root = self.index.root_node();
        if root.is_null() {
            let (_, word) = self.new_node(needed);
            self.index.root.store(word, Ordering::Release);
            return;
        }
        // SAFETY: live under the writer lock.
        let mut shift = unsafe { &*root }.shift;
        let mut current = self.index.root.load(Ordering::Relaxed);
        while shift < needed {
            shift += CHUNK_SHIFT as u8;
            let (parent, word) = self.new_node(shift);
            // SAFETY: just allocated, not yet visible to anyone.
            let p = unsafe { &*parent };
            p.slots[0].store(current, Ordering::Relaxed);
            p.count.store(1, StatOrdering::Relaxed);
            // `current` is the old root (live under the writer lock) or a node just made.
            let old = self.index.live_node(current);
            for m in 0..MARKS {
                if old.mark_bits(m) != 0 {
                    p.set_mark_bit(m, 0, true);
                }
            }
            self.index.root.store(word, Ordering::Release);
            current = word;
        }
    }

    /// Drops root levels that only lead to their first slot's child.
    fn shrink(&self) {
        loop {
            let word = self.index.root.load(Ordering::Relaxed);
            if word == 0 {
                return;
            }
            let r = self.index.live_node(word);
            let count = r.count.load(StatOrdering::Relaxed);
            if count == 0 {
                self.index.root.store(0, Ordering::Release);
                self.retire(word);
                return;
            }
            let first = r.slots[0].load(Ordering::Relaxed);
            if r.shift == 0 || count != 1 || !is_node(first) {
                return;
            }
            // Readers still inside the old root follow slot 0 to the (live) child.
            self.index.root.store(first, Ordering::Release);
            self.retire(word);
        }
    }

    /// Unlinks `node` (reached through `path`) if it became empty, and its ancestors likewise.
    fn prune(&self, mut path: Vec<(*const Node, usize)>, mut node: &Node) {
        while node.count.load(StatOrdering::Relaxed) == 0 {
            let Some((parent, offset)) = path.pop() else {
                return; // the root: `shrink` handles it
            };
            // SAFETY: live under the writer lock.
            let p = unsafe { &*parent };
            let child = p.slots[offset].load(Ordering::Relaxed);
            p.slots[offset].store(0, Ordering::Release);
            p.count.fetch_sub(1, StatOrdering::Relaxed);
            // An empty node carries no marks: its parent's bits for it were cleared with them.
            debug_assert!((0..MARKS).all(|m| node.mark_bits(m) == 0));
            self.retire(child);
            node = p;
        }
    }

    /// Looks for folios in the range of a new entry (read-only).
    fn scan(&self, index: u64, order: u8, level: u8) -> Scan {
        let mut node = self.index.root_node();
        loop {
            // SAFETY: `grow` made sure the root exists; nodes are live under the writer lock.
            let n = unsafe { &*node };
            let offset = n.offset(index);
            if n.shift == level {
                let (first_slot, span) = group(n, index, order);
                return scan_slots(
                    self.index,
                    n,
                    node_base(n, index),
                    first_slot..first_slot + span,
                );
            }
            let word = n.slots[offset].load(Ordering::Relaxed);
            if is_node(word) {
                node = self.index.live_node(word);
                continue;
            }
            return match Entry::decode(word) {
                None => Scan::Clear(None),
                Some(Entry::Value { value, .. }) => Scan::Clear(Some(value)),
                Some(Entry::Folio { order: o, .. }) => {
                    Scan::Conflict(index & !low_mask(u32::from(o)))
                }
            };
        }
    }

    /// Stores `entry` (range already checked: no folio in it).
    fn store(&self, index: u64, entry: Entry, level: u8) {
        let mut node = self.index.root_node();
        loop {
            // SAFETY: live under the writer lock.
            let n = unsafe { &*node };
            let offset = n.offset(index);
            if n.shift == level {
                break;
            }
            let word = n.slots[offset].load(Ordering::Relaxed);
            if is_node(word) {
                node = self.index.live_node(word);
                continue;
            }
            let (child, child_word) = self.new_node(n.shift - CHUNK_SHIFT as u8);
            if let Some(Entry::Value { value, order }) = Entry::decode(word) {
                // Split a value covering this slot (and maybe its neighbours) around it: the
                // neighbours keep the value as single-slot entries, the child is filled with it.
                // SAFETY: just allocated, not yet visible.
                let c = unsafe { &*child };
                let piece = Entry::Value {
                    value,
                    order: c.shift,
                }
                .encode();
                for slot in &c.slots {
                    slot.store(piece, Ordering::Relaxed);
                }
                c.count.store(CHUNK as u16, StatOrdering::Relaxed);
                self.split_group(n, offset, order, value);
            } else {
                n.count.fetch_add(1, StatOrdering::Relaxed);
            }
            n.slots[offset].store(child_word, Ordering::Release);
            node = child;
        }
        // SAFETY: live under the writer lock.
        let n = unsafe { &*node };
        let (first_slot, span) = group(n, index, entry.order());
        // A larger value whose group contains ours keeps its other slots, as single-slot pieces.
        if let Some(Entry::Value { value, order }) =
            Entry::decode(n.slots[first_slot].load(Ordering::Relaxed))
            && order > entry.order()
        {
            self.split_group(n, first_slot, order, value);
        }
        let word = entry.encode();
        let mut added = 0u16;
        for slot in &n.slots[first_slot..first_slot + span] {
            let old = slot.swap(word, Ordering::AcqRel);
            if old == 0 {
                added += 1;
            } else if is_node(old) {
                self.retire_subtree(old);
            }
        }
        n.count.fetch_add(added, StatOrdering::Relaxed);
    }

    /// Rewrites the slots of the value group (of `order`) containing `offset` as single-slot
    /// values, except `offset` itself (which the caller overwrites next).
    fn split_group(&self, node: &Node, offset: usize, order: u8, value: u64) {
        let base = offset as u64 & !low_mask(u32::from(order - node.shift));
        let span = 1usize << (order - node.shift);
        let piece = Entry::Value {
            value,
            order: node.shift,
        }
        .encode();
        for (i, slot) in node.slots[base as usize..base as usize + span]
            .iter()
            .enumerate()
        {
            if base as usize + i != offset {
                slot.store(piece, Ordering::Release);
            }
        }
    }
}

/// See [`IndexWriter::check_invariants`].
fn check_node(index: &Index, node: &Node) -> Result<(), String> {
    let mut used = 0u16;
    let mut offset = 0;
    while offset < CHUNK {
        let word = node.slots[offset].load(Ordering::Relaxed);
        let mut span = 1;
        let mut allowed = [false; MARKS];
        if is_node(word) {
            used += 1;
            // SAFETY: a child of a live node, under the writer lock.
            let child = index.live_node(word);
            check_node(index, child)?;
            allowed = std::array::from_fn(|m| child.mark_bits(m) != 0);
            for (m, &expect) in allowed.iter().enumerate() {
                let bit = node.mark_bits(m) & (1 << offset) != 0;
                if bit != expect {
                    return Err(format!(
                        "shift {} slot {offset}: mark {m} bit {bit}, the child says {expect}",
                        node.shift
                    ));
                }
            }
        } else if let Some(entry) = Entry::decode(word) {
            span = group(node, (offset as u64) << node.shift, entry.order()).1;
            used += span as u16;
            allowed = [entry.is_folio(); MARKS];
        }
        for (m, &may) in allowed.iter().enumerate() {
            for k in offset..offset + span {
                let bit = node.mark_bits(m) & (1 << k) != 0;
                if bit && (k != offset || !may) {
                    return Err(format!(
                        "shift {} slot {k}: mark {m} where no marked entry starts",
                        node.shift
                    ));
                }
            }
        }
        offset += span;
    }
    let count = node.count.load(StatOrdering::Relaxed);
    if count != used {
        return Err(format!(
            "shift {}: count {count}, {used} slots used",
            node.shift
        ));
    }
    Ok(())
}

/// The first entry under `node` (covering indexes from `base`) carrying mark `m` that covers
/// an index in `from..=last` (under the writer lock).
fn next_marked_in(
    index: &Index,
    node: &Node,
    base: u64,
    from: u64,
    last: u64,
    m: usize,
) -> Option<(u64, Entry)> {
    let shift = u32::from(node.shift);
    let bits = node.mark_bits(m);
    if bits == 0 {
        return None;
    }
    let mut start = if from <= base { 0 } else { node.offset(from) };
    // The entry covering `from` may be a group whose mark sits on an earlier slot.
    if from > base
        && let Some(entry) = Entry::decode(node.slots[start].load(Ordering::Relaxed))
    {
        start = group(node, from, entry.order()).0;
    }
    let mut rest = bits & (u64::MAX << start);
    while rest != 0 {
        let offset = rest.trailing_zeros() as usize;
        rest &= rest - 1;
        let slot_first = slot_start(base, offset, shift)?;
        if slot_first > last {
            return None;
        }
        let word = node.slots[offset].load(Ordering::Relaxed);
        if is_node(word) {
            // SAFETY: a child of a live node, under the writer lock.
            let child = index.live_node(word);
            if let Some(found) =
                next_marked_in(index, child, slot_first, from.max(slot_first), last, m)
            {
                return Some(found);
            }
            continue;
        }
        if let Some(entry) = Entry::decode(word) {
            let entry_last = slot_first | low_mask(u32::from(entry.order()));
            if entry_last >= from {
                return Some((slot_first, entry));
            }
        }
    }
    None
}

/// After marks were cleared in `node` (`was`: which of them were set), clears the bits of the
/// ancestors on `path` (root first) that now lead to no marked entry.
fn unmark_path(path: &[(*const Node, usize)], node: &Node, was: [bool; MARKS]) {
    for (m, &cleared) in was.iter().enumerate() {
        if !cleared || node.mark_bits(m) != 0 {
            continue;
        }
        for &(parent, offset) in path.iter().rev() {
            // SAFETY: the path was walked under the writer lock, which is still held.
            let p = unsafe { &*parent };
            if p.set_mark_bit(m, offset, false) & !(1u64 << offset) != 0 {
                break; // the parent still leads to other marked entries
            }
        }
    }
}

/// Looks for folios in `slots` of `node` (whose first index is `base`), subtrees included
/// (read-only, under the writer lock): the first folio's index, else the first value found.
fn scan_slots(index: &Index, node: &Node, base: u64, slots: std::ops::Range<usize>) -> Scan {
    let shift = u32::from(node.shift);
    let mut shadow = None;
    for offset in slots {
        let Some(slot_first) = slot_start(base, offset, shift) else {
            break;
        };
        let word = node.slots[offset].load(Ordering::Relaxed);
        if is_node(word) {
            // SAFETY: a child of a live node, under the writer lock.
            let child = index.live_node(word);
            match scan_slots(index, child, slot_first, 0..CHUNK) {
                Scan::Conflict(at) => return Scan::Conflict(at),
                Scan::Clear(found) => shadow = shadow.or(found),
            }
            continue;
        }
        match Entry::decode(word) {
            Some(Entry::Folio { order, .. }) => {
                return Scan::Conflict(slot_first & !low_mask(u32::from(order)));
            }
            Some(Entry::Value { value, .. }) => shadow = shadow.or(Some(value)),
            None => {}
        }
    }
    Scan::Clear(shadow)
}

/// The first index of slot `offset` in a node of `shift` starting at `base`; None past the
/// largest index.
fn slot_start(base: u64, offset: usize, shift: u32) -> Option<u64> {
    let delta = (offset as u64).checked_shl(shift)?;
    if delta >> shift != offset as u64 {
        return None;
    }
    base.checked_add(delta)
}

/// The first index of the span `node` covers, given an index inside it.
fn node_base(node: &Node, index: u64) -> u64 {
    index & !low_mask(u32::from(node.shift) + CHUNK_SHIFT)
}

/// The slots an entry of `order` at `index` occupies in `node`: (first slot, count).
fn group(node: &Node, index: u64, order: u8) -> (usize, usize) {
    let span_bits = u32::from(order.saturating_sub(node.shift)).min(CHUNK_SHIFT);
    let span = 1usize << span_bits;
    let first = node.offset(index) & !(span - 1);
    (first, span)
}

/// The smallest root shift whose span covers `last`.
fn height_for(last: u64) -> u8 {
    let mut shift = 0u32;
    while shift + CHUNK_SHIFT < 64 && last >> (shift + CHUNK_SHIFT) != 0 {
        shift += CHUNK_SHIFT;
    }
    shift as u8
}

/// Checks that an entry of `order` at `index` is aligned and fits in the index space.
/// Whether `entries` can go in one after another from `start`, as
/// [`IndexWriter::insert_range`] takes them: each aligned to its order, no value too large, and
/// no entry but the last running past the largest index.
pub(crate) fn check_run(start: u64, entries: &[Entry]) -> Result<(), Error> {
    let mut index = start;
    for (i, entry) in entries.iter().enumerate() {
        check_range(index, entry.order())?;
        if let Entry::Value { value, .. } = *entry
            && value > MAX_VALUE
        {
            return Err(Error::ValueTooLarge { value });
        }
        let next = index.checked_add(1u64 << entry.order());
        if next.is_none() && i + 1 < entries.len() {
            return Err(Error::IndexOverflow {
                index,
                order: entry.order(),
            });
        }
        index = next.unwrap_or(0);
    }
    Ok(())
}

fn check_range(index: u64, order: u8) -> Result<(), Error> {
    if order > MAX_ENTRY_ORDER {
        return Err(Error::OrderTooLarge {
            order,
            max: MAX_ENTRY_ORDER,
        });
    }
    if index & low_mask(u32::from(order)) != 0 {
        return Err(Error::Misaligned { index, order });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The walk takes each level's shift from its parent, so a corrupted tree (as a shared
    /// mapping may hold: here a bottom node's slot naming a node above it, a cycle) ends at
    /// the bottom level as a hole instead of walking on forever.
    #[test]
    fn a_node_word_in_a_bottom_node_reads_as_a_hole() {
        let index = Index::new();
        let value = |value| Entry::Value { value, order: 0 };
        {
            let mut writer = index.lock();
            writer.insert(0, value(1)).unwrap();
            writer.insert(1 << 12, value(2)).unwrap();
        }
        let pin = pin();
        let root = index.root_node();
        // SAFETY: the root was loaded under `pin`, which is still held.
        let shift = root_shift(unsafe { &*root }).unwrap();
        assert_eq!(shift, 12);
        // SAFETY: as above.
        let upper_word = unsafe { &*root }.slots[0].load(Ordering::Acquire);
        assert!(is_node(upper_word));
        let (leaf, leaf_shift, offset, word) = index.walk(root, shift, 5);
        assert_eq!((leaf_shift, offset, word), (0, 5, 0));
        // SAFETY: `walk` returned a node reached under `pin`.
        let slot = &unsafe { &*leaf }.slots[offset];
        slot.store(upper_word, Ordering::Release);
        assert_eq!(
            index.load(5),
            None,
            "a node word where an entry belongs is a hole"
        );
        assert_eq!(index.load(0), Some(value(1)));
        let mut cursor = index.cursor();
        assert_eq!(cursor.load(4), None);
        assert_eq!(
            cursor.peek_next(),
            None,
            "a node word in a leaf is no entry"
        );
        assert_eq!(cursor.load(5), None);
        assert_eq!(cursor.load_next(), None);
        drop(cursor);
        // Put the tree back before it is dropped (its teardown follows node words).
        slot.store(0, Ordering::Release);
        drop(pin);
        assert_eq!(index.load(1 << 12), Some(value(2)));
    }

    /// `peek_next` reads the slot right after the last load when it lies in the same leaf,
    /// and leaves the cursor where it was.
    #[test]
    fn peek_next_reads_the_next_slot_of_the_same_leaf_only() {
        let index = Index::new();
        let value = |value, order| Entry::Value { value, order };
        {
            let mut writer = index.lock();
            writer.insert(4, value(1, 2)).unwrap();
            writer.insert(8, value(2, 0)).unwrap();
            writer.insert(63, value(3, 0)).unwrap();
            writer.insert(64, value(4, 0)).unwrap();
        }
        let mut cursor = index.cursor();
        assert_eq!(cursor.load(5), Some(value(1, 2)));
        assert_eq!(
            cursor.peek_next(),
            Some(value(2, 0)),
            "the entry after one covering 4..=7"
        );
        assert_eq!(cursor.reload(), Some(value(1, 2)), "the cursor stays");
        assert_eq!(cursor.load_next(), Some(value(2, 0)));
        assert_eq!(cursor.peek_next(), None, "index 9 is a hole");
        assert_eq!(cursor.load(63), Some(value(3, 0)));
        assert_eq!(cursor.peek_next(), None, "index 64 lies in the next leaf");
        assert_eq!(cursor.load_next(), Some(value(4, 0)));
    }
}
