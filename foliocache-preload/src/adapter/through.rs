//! Write-through mode: the program's writes go to the kernel through its own fd, and then the
//! cache drops what they made stale (under the write lease nobody else writes, so that keeps
//! the cache exact).

use super::Inode;
use crate::config::Writes;
use crate::stats;
use std::sync::atomic::Ordering;

impl Inode {
    /// Write-through: after the kernel wrote `pos..pos + len` through the program's fd (or
    /// changed the size in ways the hook cannot name, `len` = `u64::MAX`), no cached byte of
    /// the range may survive.
    pub(crate) fn written(&self, pos: u64, len: u64) {
        if self.writes != Writes::Through || len == 0 {
            return;
        }
        let Some(file) = self.file.get() else { return };
        stats::invalidation();
        if !self.serving.now() {
            // Dropped before the cache serves again.
            self.stale.store(true, Ordering::Release);
            return;
        }
        if len == u64::MAX {
            if file.changed_outside().is_err() {
                self.stale.store(true, Ordering::Release);
                self.serving.stop_now();
            }
        } else {
            file.written_outside(pos, len);
        }
    }
}
