//! Counters: the snapshots a user reads ([`RaStats`]) and the live counters behind them.
//!
//! Readahead's counters live here, below the per-file state that holds them, so that the file
//! state does not depend on the readahead module that fills it.

use crate::sync::unmodelled::Counter;

/// Counters of readahead decisions and fills (a snapshot), per file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RaStats {
    /// Misses that started a stream (`SyncFresh`).
    pub sync_fresh: u64,
    /// Misses sized from cached history (`SyncContext`).
    pub sync_context: u64,
    /// Small random reads that read only the request (`SyncRandom`).
    pub sync_random: u64,
    /// Forced reads (random mode, `readahead()`, `WillNeed`).
    pub forced: u64,
    /// Marks hit where expected: the pipelined continuation.
    pub async_pipelined: u64,
    /// Marks hit elsewhere (interleaved streams) and recovered from the index.
    pub async_recovered: u64,
    /// Marks hit with the area ahead already cached (nothing read).
    pub async_skipped: u64,
    /// Windows filled.
    pub windows: u64,
    /// Pages inserted by readahead.
    pub pages: u64,
    /// Folios inserted by readahead.
    pub folios: u64,
    /// Marks set.
    pub marks: u64,
    /// Windows that reached end of file (no mark set).
    pub windows_at_eof: u64,
    /// Pages skipped because a folio was already there.
    pub present_skips: u64,
    /// Large-folio windows that fell back to pages (a folio present, or no memory).
    pub order_fallbacks: u64,
    /// Batched fills that could not allocate the whole window and went one by one.
    pub batch_alloc_fallbacks: u64,
    /// Fills that stopped early for lack of memory.
    pub out_of_memory: u64,
    /// Folios read one at a time by a reader (readahead gave nothing, or a retry after an
    /// error).
    pub read_folio: u64,
    /// Fault read-around windows (mapped access).
    pub read_around: u64,
    /// Fault windows in the exec folio order (seed 001).
    pub exec_windows: u64,
    /// Faults that read nothing ahead because the region missed too often (`mmap_miss`).
    pub mmap_gave_up: u64,
}

impl std::ops::Add for RaStats {
    type Output = Self;

    /// Field-wise sums (counters of several files).
    fn add(self, b: Self) -> Self {
        Self {
            sync_fresh: self.sync_fresh + b.sync_fresh,
            sync_context: self.sync_context + b.sync_context,
            sync_random: self.sync_random + b.sync_random,
            forced: self.forced + b.forced,
            async_pipelined: self.async_pipelined + b.async_pipelined,
            async_recovered: self.async_recovered + b.async_recovered,
            async_skipped: self.async_skipped + b.async_skipped,
            windows: self.windows + b.windows,
            pages: self.pages + b.pages,
            folios: self.folios + b.folios,
            marks: self.marks + b.marks,
            windows_at_eof: self.windows_at_eof + b.windows_at_eof,
            present_skips: self.present_skips + b.present_skips,
            order_fallbacks: self.order_fallbacks + b.order_fallbacks,
            batch_alloc_fallbacks: self.batch_alloc_fallbacks + b.batch_alloc_fallbacks,
            out_of_memory: self.out_of_memory + b.out_of_memory,
            read_folio: self.read_folio + b.read_folio,
            read_around: self.read_around + b.read_around,
            exec_windows: self.exec_windows + b.exec_windows,
            mmap_gave_up: self.mmap_gave_up + b.mmap_gave_up,
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct RaCounters {
    pub(crate) sync_fresh: Counter,
    pub(crate) sync_context: Counter,
    pub(crate) sync_random: Counter,
    pub(crate) forced: Counter,
    pub(crate) async_pipelined: Counter,
    pub(crate) async_recovered: Counter,
    pub(crate) async_skipped: Counter,
    pub(crate) windows: Counter,
    pub(crate) pages: Counter,
    pub(crate) folios: Counter,
    pub(crate) marks: Counter,
    pub(crate) windows_at_eof: Counter,
    pub(crate) present_skips: Counter,
    pub(crate) order_fallbacks: Counter,
    pub(crate) batch_alloc_fallbacks: Counter,
    pub(crate) out_of_memory: Counter,
    pub(crate) read_folio: Counter,
    pub(crate) read_around: Counter,
    pub(crate) exec_windows: Counter,
    pub(crate) mmap_gave_up: Counter,
}

impl RaCounters {
    pub(crate) fn snapshot(&self) -> RaStats {
        RaStats {
            sync_fresh: self.sync_fresh.get(),
            sync_context: self.sync_context.get(),
            sync_random: self.sync_random.get(),
            forced: self.forced.get(),
            async_pipelined: self.async_pipelined.get(),
            async_recovered: self.async_recovered.get(),
            async_skipped: self.async_skipped.get(),
            windows: self.windows.get(),
            pages: self.pages.get(),
            folios: self.folios.get(),
            marks: self.marks.get(),
            windows_at_eof: self.windows_at_eof.get(),
            present_skips: self.present_skips.get(),
            order_fallbacks: self.order_fallbacks.get(),
            batch_alloc_fallbacks: self.batch_alloc_fallbacks.get(),
            out_of_memory: self.out_of_memory.get(),
            read_folio: self.read_folio.get(),
            read_around: self.read_around.get(),
            exec_windows: self.exec_windows.get(),
            mmap_gave_up: self.mmap_gave_up.get(),
        }
    }
}
