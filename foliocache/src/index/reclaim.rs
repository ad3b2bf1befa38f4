//! Deferred freeing of index nodes: the RCU of this index.
//!
//! A reader walks nodes without any lock, so a node a writer unlinks may still be under a
//! reader's feet. Readers *pin* an epoch for the duration of one lookup or one batch (the
//! `rcu_read_lock` section); writers *retire* unlinked nodes, and a node's memory is freed only
//! once every thread pinned at the time it was retired has unpinned. The epochs are the crate's
//! own ([`crate::mem::epoch`]), shared with folio grace periods; a pin writes only the thread's
//! own cache line, which the lock-free read side needs (seed 002's benchmark is exactly many
//! threads reading one file). We never pin across I/O.

use super::NODE_BYTES;
use super::node::Node;
use crate::mem::NodeMeter;
pub(crate) use crate::mem::epoch::{Guard, pin};
use std::sync::Arc;

/// An unlinked node on its way to being freed.
struct Retired(*mut Node);

// SAFETY: a `Node` is only atomics and plain integers, so freeing it from another thread is
// sound; the pointer is owned by the deferred function alone (retired exactly once).
unsafe impl Send for Retired {}

impl Retired {
    /// Takes the pointer out (a method, so a closure captures the whole `Retired`, not the
    /// raw pointer field).
    fn into_raw(self) -> *mut Node {
        self.0
    }
}

/// Frees `node` once no reader pinned now can still reach it.
///
/// # Safety
/// `node` came from `Box::into_raw`, is unreachable from the index for any reader that pins
/// after this call, and is retired exactly once.
pub(crate) unsafe fn retire(_guard: &Guard, node: *mut Node, meter: Arc<NodeMeter>) {
    let node = Retired(node);
    crate::mem::epoch::defer(move || {
        let ptr = node.into_raw();
        // SAFETY: per this function's contract the node came from `Box::into_raw` and is retired
        // once; the epoch runs this only after every reader that could reach it has unpinned.
        drop(unsafe { Box::from_raw(ptr) });
        meter.credit(NODE_BYTES);
    });
}

/// Gives the room of the node `word` names back to `space` once no reader pinned now can still
/// reach it (the shared cache's nodes: see `mem::nodes`). The node must be unlinked and retired
/// once, as for [`retire`]. Readers in other processes pin too (`mem::epoch`, external pins).
#[cfg(not(loom))]
pub(crate) fn retire_in_space(
    _guard: &Guard,
    word: usize,
    space: Arc<dyn crate::mem::nodes::NodeSpace>,
    meter: Arc<NodeMeter>,
) {
    crate::mem::epoch::defer(move || {
        space.free(word);
        meter.credit(NODE_BYTES);
    });
}
