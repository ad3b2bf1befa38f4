//! Deferred freeing of index nodes: the RCU of this index.
//!
//! A reader walks nodes without any lock, so a node a writer unlinks may still be under a
//! reader's feet. Readers *pin* an epoch for the duration of one lookup or one batch (the
//! `rcu_read_lock` section); writers *retire* unlinked nodes, and a node's memory is freed only
//! once every thread pinned at the time it was retired has unpinned.
//!
//! Why crossbeam-epoch: it is the maintained, loom-tested epoch scheme of the Rust ecosystem; a
//! pin is a few nanoseconds and touches only thread-local state, which the lock-free read side
//! needs (seed 002's benchmark is exactly many threads reading one file). Its weakness, a pinned
//! thread delaying reclamation of everything retired meanwhile, matters little here: nodes are
//! retired rarely (when a range empties or the tree shrinks), and we never pin across I/O.
//!
//! Under `--cfg loom` a pin is a no-op and retired nodes are kept until the index is dropped:
//! the models check the folio protocol on top of the index, not crossbeam's own epoch
//! algorithm, which its authors model separately.

use super::NodeMeter;
use super::node::Node;
use std::sync::Arc;

#[cfg(not(loom))]
pub(crate) struct Guard(crossbeam_epoch::Guard);

#[cfg(loom)]
pub(crate) struct Guard(());

#[cfg(not(loom))]
pub(crate) fn pin() -> Guard {
    Guard(crossbeam_epoch::pin())
}

#[cfg(loom)]
pub(crate) fn pin() -> Guard {
    Guard(())
}

/// Nodes retired under loom, freed when the index is dropped.
#[derive(Debug, Default)]
pub(crate) struct Retired {
    #[cfg(loom)]
    nodes: std::sync::Mutex<Vec<(usize, Arc<NodeMeter>)>>,
}

impl Retired {
    /// Frees `node` once no reader pinned now can still reach it.
    ///
    /// # Safety
    /// `node` came from `Box::into_raw`, is unreachable from the index for any reader that pins
    /// after this call, and is retired exactly once.
    #[cfg(not(loom))]
    pub(crate) unsafe fn retire(&self, guard: &Guard, node: *mut Node, meter: Arc<NodeMeter>) {
        // SAFETY: per this function's contract, the node is unlinked and retired once; the
        // epoch scheme runs the closure only after every guard that could see it is dropped.
        // The closure may run on another thread: that is sound because a `Node` is only atomics
        // and plain integers (`Box<Node>` is `Send`), and the meter is shared by an `Arc`.
        unsafe {
            guard.0.defer_unchecked(move || {
                drop(Box::from_raw(node));
                meter.freed(1);
            });
        }
    }

    /// # Safety
    /// As the non-loom version.
    #[cfg(loom)]
    pub(crate) unsafe fn retire(&self, _guard: &Guard, node: *mut Node, meter: Arc<NodeMeter>) {
        self.nodes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((node as usize, meter));
    }
}

#[cfg(loom)]
impl Drop for Retired {
    fn drop(&mut self) {
        for (node, meter) in self
            .nodes
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain(..)
        {
            // SAFETY: the index is being dropped (no readers), and each retired node was
            // recorded once, by `retire`, from a `Box::into_raw` pointer.
            drop(unsafe { Box::from_raw(node as *mut Node) });
            meter.freed(1);
        }
    }
}
