//! Files and handles: the public face of a cached file.
//!
//! A [`File`] is shared by everyone using one file: its mapping (index, size, counters) and
//! where its bytes come from (an [`Inode`]). A [`Handle`] is one user's view of it (per-reader
//! state such as the position after the last read, which readahead uses). Memory files (the
//! tmpfs of this cache) are described in `memfile`.

use crate::error::Error;
use crate::inode::Inode;
use crate::inode::Revalidated;
use crate::io::IoStats;
use crate::mapping::{Mapping, MappingStats, Recent, RemoveError};
use crate::mem::{PAGE_SHIFT, PAGE_SIZE};
use crate::opened::Opened;
use crate::policy::{Policy, ReadPolicy, SmallReadPolicy};
use crate::read::{self, ReadRun};
use crate::readahead::{self, RaState};
use crate::stats::RaStats;
use std::sync::Arc;

/// A file in the cache, shared by all its users. Cloning it is cheap (a reference count).
/// When the last clone (and the last [`Handle`] of it) is dropped, the file's dirty data is
/// written back.
#[derive(Debug, Clone)]
pub struct File {
    repr: Repr,
}

#[derive(Debug, Clone)]
enum Repr {
    /// A file of a cache this process runs.
    Local {
        inner: Arc<Inode>,
        /// Shared by every clone: the last one to go writes the file back (see `Opened`).
        _opened: Arc<Opened>,
    },
    /// A file of a shared cache this process is attached to.
    #[cfg(not(loom))]
    Client(Arc<ClientFile>),
}

#[cfg(not(loom))]
use crate::shared::client::ClientFile;

/// What a shared cache's client cannot do.
#[cfg(not(loom))]
fn unsupported(what: &'static str) -> Error {
    Error::Unsupported {
        what,
        mode: "shared",
    }
}

/// The state of the folios of a [`CachedRange`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageState {
    /// Valid, and what storage has.
    Uptodate,
    /// Valid, newer than storage: written, not yet written back.
    Dirty,
    /// Being written back.
    Writeback,
    /// A read is in flight.
    Reading,
    /// The last read failed (a later read retries).
    Failed,
}

/// A run of cached pages in one state (see [`File::cached_ranges`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedRange {
    /// First page index.
    pub first: u64,
    /// Pages in the run.
    pub pages: u64,
    /// Folios in the run.
    pub folios: u64,
    /// The largest folio order in the run.
    pub largest_order: u8,
    /// Their state.
    pub state: PageState,
    /// First pages of folios carrying the READAHEAD mark.
    pub marks: Vec<u64>,
}

/// What [`File::drop_cached`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DropReport {
    /// Pages dropped from the cache.
    pub dropped_pages: u64,
    /// Pages in the range that stayed because they were in use (a read in flight, or a
    /// reader's reference).
    pub busy_pages: u64,
}

/// Access-pattern advice for a handle ([`Handle::advise`]), as `posix_fadvise(2)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advice {
    /// The default heuristics, with the file's default maximum window.
    Normal,
    /// Sequential: the maximum window doubles.
    Sequential,
    /// Random: no readahead heuristics; a miss reads exactly what was asked.
    Random,
    /// Read this byte range soon: start reading it now (forced readahead, no marks).
    WillNeed {
        /// First byte.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// This byte range is not needed: drop its idle folios from the cache.
    DontNeed {
        /// First byte.
        offset: u64,
        /// Bytes (0: to end of file).
        len: u64,
    },
}

/// One reader's view of a [`File`].
#[derive(Debug, Clone)]
pub struct Handle {
    file: File,
    /// This reader's readahead state, including the position after its last read.
    pub(crate) ra: RaState,
    /// This reader's read-side policies (the cache's unless changed).
    policy: Policy,
    /// Where this handle is in the file's writeback error sequence (errseq): the errors it
    /// has not been told of are the ones recorded since.
    wb_since: u32,
    /// This writer's sequential stream, for write-behind.
    stream: Stream,
    /// The folio this reader's last optimistic small read copied from last.
    recent: Option<Recent>,
}

/// A handle's writes as a stream: where the next sequential write starts, and from where the
/// data behind the writer has not yet been handed to the flusher.
#[derive(Debug, Clone, Copy, Default)]
struct Stream {
    next: u64,
    behind: u64,
}

impl File {
    pub(crate) fn from_opened(opened: Arc<Opened>) -> Self {
        Self {
            repr: Repr::Local {
                inner: Arc::clone(&opened.inode),
                _opened: opened,
            },
        }
    }

    #[cfg(not(loom))]
    pub(crate) fn from_client(client: Arc<ClientFile>) -> Self {
        Self {
            repr: Repr::Client(client),
        }
    }

    /// The file's inode, if this process runs its cache.
    pub(crate) fn local(&self) -> Option<&Arc<Inode>> {
        match &self.repr {
            Repr::Local { inner, .. } => Some(inner),
            #[cfg(not(loom))]
            Repr::Client(_) => None,
        }
    }

    /// The file's inode, for the internals (`raw`, tests of a private cache). A shared cache's
    /// client has none; asking is a programming error.
    pub(crate) fn inode(&self) -> &Arc<Inode> {
        self.local().unwrap_or_else(|| {
            panic!("this needs a file of a cache this process runs, not of a shared cache")
        })
    }

    /// A new reader of this file.
    pub fn handle(&self) -> Handle {
        match &self.repr {
            Repr::Local { inner, .. } => Handle {
                file: self.clone(),
                ra: RaState::new(inner.core.ra_pages),
                policy: inner.policy,
                wb_since: inner.disk().map_or(0, |disk| disk.wb.errors.sample()),
                stream: Stream::default(),
                recent: None,
            },
            #[cfg(not(loom))]
            Repr::Client(client) => {
                let settings = client.attachment().map.fixed().settings;
                let policy = crate::shared::settings::policy(&settings).unwrap_or_default();
                let ra_bytes = settings[crate::shared::settings::RA_BYTES];
                Handle {
                    file: self.clone(),
                    ra: RaState::new(ra_bytes >> PAGE_SHIFT),
                    policy,
                    wb_since: client.errseq_now(),
                    stream: Stream::default(),
                    recent: None,
                }
            }
        }
    }

    /// Whether the file's bytes come from storage (a backend) rather than only memory.
    pub fn is_disk_file(&self) -> bool {
        match &self.repr {
            Repr::Local { inner, .. } => inner.disk().is_some(),
            #[cfg(not(loom))]
            Repr::Client(_) => true,
        }
    }

    /// The backend's description (engine and mode), for a file read from storage.
    pub fn backend_description(&self) -> Option<String> {
        match &self.repr {
            Repr::Local { inner, .. } => inner.disk().map(|disk| disk.backend.describe()),
            #[cfg(not(loom))]
            Repr::Client(client) => Some(format!(
                "shared cache {} (its owner reads and writes the file)",
                client.attachment().name()
            )),
        }
    }

    /// Readahead counters of this file (all zero for a memory file; a shared cache's client
    /// gets the file's counters from the owner).
    pub fn readahead_stats(&self) -> RaStats {
        match &self.repr {
            Repr::Local { inner, .. } => inner
                .disk()
                .map_or_else(RaStats::default, |disk| disk.ra.snapshot()),
            #[cfg(not(loom))]
            Repr::Client(client) => client.readahead_stats(),
        }
    }

    /// I/O counters of this file (all zero for a memory file).
    pub fn io_stats(&self) -> IoStats {
        match &self.repr {
            Repr::Local { inner, .. } => inner
                .disk()
                .map_or_else(IoStats::default, |disk| disk.io.snapshot()),
            #[cfg(not(loom))]
            Repr::Client(client) => client.io_stats(),
        }
    }

    /// Waits until no read of this file is in flight (every cached folio unlocked): what
    /// readahead started has then settled, uptodate or failed.
    pub fn wait_for_io(&self) {
        match &self.repr {
            Repr::Local { inner, .. } => inner
                .mapping
                .for_each_cached(0, u64::MAX, |folio| folio.wait_unlocked()),
            #[cfg(not(loom))]
            Repr::Client(client) => client.wait_for_io(),
        }
    }

    /// The cached page ranges of the file, in order: runs of folios that are adjacent in the
    /// file and share their state (uptodate, failed, or a read in flight), with the pages that
    /// carry a READAHEAD mark. What `fincore` or `vmtouch` show for the kernel's cache.
    pub fn cached_ranges(&self) -> Vec<CachedRange> {
        match &self.repr {
            Repr::Local { inner, .. } => cached_ranges(&inner.mapping),
            #[cfg(not(loom))]
            Repr::Client(client) => client.cached_ranges(),
        }
    }

    /// Drops the idle folios of `offset..offset + len` (0: to end of file) from the cache, as
    /// `POSIX_FADV_DONTNEED` does: pages only partly inside the range stay (as the kernel
    /// rounds), and so do folios in use: locked (a read in flight), referenced by a reader, or
    /// dirty or under writeback (reported as busy; writeback of dirty data is started, so a
    /// later call can drop it). A memory file's folios are its data and stay.
    pub fn drop_cached(&self, offset: u64, len: u64) -> DropReport {
        match &self.repr {
            Repr::Local { inner, .. } => drop_cached(inner, offset, len),
            #[cfg(not(loom))]
            Repr::Client(client) => client.drop_cached(offset, len),
        }
    }

    /// Looks at the file on storage again and, if another program changed it since this cache
    /// last looked (at open, or at the last revalidation), takes its new size and drops every
    /// cached page that may be stale (the kernel's `invalidate_mapping_pages`, for the whole
    /// file). Reads after this see the file as it is now. Opening a file the cache has open
    /// revalidates it too ([`OpenOptions::revalidate`](crate::OpenOptions::revalidate)).
    ///
    /// What is coherent: everything read after a revalidation that followed the other
    /// program's change. What is not: reads between that change and the revalidation may
    /// return the old bytes, or a mix of old and new pages. A change is seen through the size
    /// and the modification and change times; a rewrite that keeps the size within one tick of
    /// the file system's clock is missed. A memory file never changes behind the cache.
    ///
    /// A file of a [`WriteBackend`](crate::WriteBackend) (an object) that holds changes not
    /// yet committed keeps its version: if storage changed, that is a conflict, returned as
    /// [`Error::Io`] with `ESTALE`, and nothing is dropped.
    pub fn revalidate(&self) -> Result<Revalidated, Error> {
        match &self.repr {
            Repr::Local { inner, .. } => inner.revalidate(),
            #[cfg(not(loom))]
            Repr::Client(client) => client.revalidate(),
        }
    }

    /// The file size in bytes.
    pub fn size(&self) -> u64 {
        match &self.repr {
            Repr::Local { inner, .. } => inner.mapping.size(),
            #[cfg(not(loom))]
            Repr::Client(client) => client.size(),
        }
    }

    /// The largest folio order this file uses.
    pub fn max_order(&self) -> u8 {
        match &self.repr {
            Repr::Local { inner, .. } => inner.max_order,
            #[cfg(not(loom))]
            Repr::Client(client) => client.max_order(),
        }
    }

    /// The file's mapping counters: lookups, index walks, lock acquisitions, insertions,
    /// removals, cached pages and index bytes (a shared cache's client: the owner's mapping).
    pub fn mapping_stats(&self) -> MappingStats {
        match &self.repr {
            Repr::Local { inner, .. } => inner.mapping.stats(),
            #[cfg(not(loom))]
            Repr::Client(client) => client.mapping_stats(),
        }
    }

    pub(crate) fn mapping(&self) -> &Mapping {
        &self.inode().mapping
    }

    /// Reads at `pos` with a fresh handle (see [`Handle::read_at`]).
    pub fn read_at(&self, buf: &mut [u8], pos: u64) -> Result<usize, Error> {
        self.handle().read_at(buf, pos)
    }

    /// Writes all of `data` at `pos`, extending the file if it ends past end of file.
    ///
    /// A memory file's write is all or nothing: without memory for it, [`Error::NoSpace`] and
    /// the file is unchanged. A file from storage (opened with
    /// [`OpenOptions::write`](crate::OpenOptions::write)) takes the write into the cache as
    /// dirty folios, written to storage later (the flusher, [`Handle::sync_all`], or when the
    /// last holder of the file lets go); a reader sees each folio the write touches either
    /// wholly before or wholly after it, never torn. Writers are throttled when dirty memory
    /// is high (see [`CacheBuilder::dirty_ratio`](crate::CacheBuilder::dirty_ratio)). An error
    /// after part of the data went in ([`Error::Io`] reading a partly written page) gives the
    /// first byte not written as its offset.
    ///
    /// In a shared cache the write is in the cache when this returns: every process reads it,
    /// and it is written back even if this process dies.
    pub fn write_at(&self, data: &[u8], pos: u64) -> Result<usize, Error> {
        match &self.repr {
            Repr::Local { inner, .. } => {
                inner.writable()?;
                if inner.disk().is_some() {
                    return inner.disk_write_at(data, pos);
                }
                inner.mem_write_at(data, pos)
            }
            #[cfg(not(loom))]
            Repr::Client(client) => client.write_at(data, pos),
        }
    }

    /// Sets the file size. Shrinking drops the folios that lie wholly past the new end (dirty
    /// ones with their data) and zeroes the rest of the one holding it; growing adds a hole
    /// (nothing allocated, reads as zeros). For a file from storage the size on storage is
    /// set at once (`ftruncate`).
    pub fn set_len(&self, len: u64) -> Result<(), Error> {
        match &self.repr {
            Repr::Local { inner, .. } => {
                inner.writable()?;
                if inner.disk().is_some() {
                    return inner.disk_set_len(len);
                }
                inner.mem_set_len(len)
            }
            #[cfg(not(loom))]
            Repr::Client(client) => client.change(crate::shared::mailbox::op::SET_LEN, len, 0),
        }
    }

    /// Allocates `offset..offset + len` and extends the file to `offset + len` if it is
    /// shorter (like `fallocate(2)` without flags). A memory file gets folios for its holes
    /// (not uptodate: they read as zeros), all or nothing; a file from storage gets the blocks
    /// allocated on storage (file systems without `fallocate` give an [`Error::Io`]).
    pub fn fallocate(&self, offset: u64, len: u64) -> Result<(), Error> {
        match &self.repr {
            Repr::Local { inner, .. } => {
                inner.writable()?;
                if inner.disk().is_some() {
                    return inner.disk_fallocate(offset, len);
                }
                inner.mem_fallocate(offset, len)
            }
            #[cfg(not(loom))]
            Repr::Client(client) => {
                client.change(crate::shared::mailbox::op::FALLOCATE, offset, len)
            }
        }
    }

    /// Makes `offset..offset + len` read as zeros and frees the folios wholly inside it; folios
    /// partly inside are replaced by copies with that part zeroed. The size does not change.
    /// A file from storage has the blocks deallocated on storage too (`FALLOC_FL_PUNCH_HOLE`;
    /// file systems without it give an [`Error::Io`]).
    pub fn punch_hole(&self, offset: u64, len: u64) -> Result<(), Error> {
        match &self.repr {
            Repr::Local { inner, .. } => {
                inner.writable()?;
                if inner.disk().is_some() {
                    return inner.disk_punch_hole(offset, len);
                }
                inner.mem_punch_hole(offset, len)
            }
            #[cfg(not(loom))]
            Repr::Client(client) => {
                client.change(crate::shared::mailbox::op::PUNCH_HOLE, offset, len)
            }
        }
    }

    /// Writes back the file's dirty data and waits for it, then has the file system make it
    /// durable (`fsync`), as a fresh handle's [`Handle::sync_all`] does: an error is one
    /// recorded since this call, or one nobody has seen yet.
    pub fn sync_all(&self) -> Result<(), Error> {
        self.handle().sync_all()
    }

    /// Whether the file can be changed through this cache.
    pub fn is_writable(&self) -> bool {
        match &self.repr {
            Repr::Local { inner, .. } => inner.writable().is_ok(),
            #[cfg(not(loom))]
            Repr::Client(client) => client.is_writable(),
        }
    }

    /// Hands back the descriptor lent at [`Cache::open_descriptor`](crate::Cache::open_descriptor)
    /// (or at the last [`attach_descriptor`](Self::attach_descriptor)), for the caller to close
    /// when it chooses: no read or write starts through it from now on, the transfers in
    /// flight are waited for, and the file remembers how storage looks now, so that the next
    /// attach can tell whether another program changed it meanwhile. The cached pages stay;
    /// until a descriptor is attached again, a read that misses fails ([`Error::Detached`]
    /// as the cause) and the folio stays not uptodate.
    ///
    /// Refused with [`Error::StillDirty`] while the file holds data not yet written back (sync
    /// first); [`Error::Detached`] if no descriptor is lent (a file opened by path, or one
    /// detached already). In a shared cache the dirty data belongs to the cache (its owner
    /// writes it back), so a detach is never refused for it, and the owner serves the file
    /// to other processes as before.
    pub fn detach_descriptor(&self) -> Result<std::os::fd::OwnedFd, Error> {
        match &self.repr {
            Repr::Local { inner, .. } => inner.detach_descriptor(),
            #[cfg(not(loom))]
            Repr::Client(client) => client.detach_descriptor(),
        }
    }

    /// Lends the file a descriptor again after [`detach_descriptor`](Self::detach_descriptor)
    /// (`write`: for writes too, as at [`Cache::open_descriptor`](crate::Cache::open_descriptor)),
    /// and looks at the file on storage: if it changed since the detach, clean cached pages
    /// are dropped and the new size is taken ([`revalidate`](Self::revalidate)). The
    /// descriptor must be of the same file ([`Error::OpenConflict`] otherwise); a refused
    /// descriptor comes back unclosed with the error ([`crate::DescriptorRefused`]).
    pub fn attach_descriptor(
        &self,
        fd: std::os::fd::OwnedFd,
        write: bool,
    ) -> Result<crate::inode::Revalidated, crate::error::DescriptorRefused> {
        match &self.repr {
            Repr::Local { inner, .. } => inner.attach_descriptor(fd, write),
            #[cfg(not(loom))]
            Repr::Client(client) => {
                client
                    .attach_descriptor(fd, write)
                    .map(|()| crate::inode::Revalidated {
                        changed: false,
                        size: client.size(),
                        dropped_pages: 0,
                    })
            }
        }
    }

    /// The caller wrote `offset..offset + len` of the file on storage itself, around the cache
    /// (through another descriptor of the file): every clean cached folio overlapping the
    /// range is removed from the file (readers already copying one finish with the old bytes,
    /// as a read racing a write may), reads in flight there included, and the size grows to
    /// cover the write. Dirty folios stay: the caller must not write around data the cache
    /// holds dirty. The kernel's `invalidate_inode_pages2_range` after a direct write.
    pub fn written_outside(&self, offset: u64, len: u64) {
        match &self.repr {
            Repr::Local { inner, .. } => inner.written_outside(offset, len),
            #[cfg(not(loom))]
            Repr::Client(client) => client.written_outside(offset, len),
        }
    }

    /// The caller changed the file on storage in ways it cannot name (a truncation, an
    /// `fallocate` mode the cache does not do): every clean page is dropped and the size taken
    /// from storage, as a [`revalidate`](Self::revalidate) that found a change.
    pub fn changed_outside(&self) -> Result<crate::inode::Revalidated, Error> {
        match &self.repr {
            Repr::Local { inner, .. } => inner.changed_outside(),
            #[cfg(not(loom))]
            Repr::Client(client) => client.changed_outside(),
        }
    }

    /// In a shared cache, how many reads of this process through this file asked the owner
    /// (each a miss here: the bytes were not all in the mapping); `None` in a private cache,
    /// whose [`readahead_stats`](Self::readahead_stats) count its own misses. (A shared
    /// file's readahead and I/O counters are the whole cache's, every process's reads.)
    pub fn process_misses(&self) -> Option<u64> {
        match &self.repr {
            Repr::Local { .. } => None,
            #[cfg(not(loom))]
            Repr::Client(client) => Some(client.asked.load(std::sync::atomic::Ordering::Relaxed)),
        }
    }

    /// Drops the data the file holds dirty, as the kernel does after a failed writeback, and
    /// records `errno` in the file's writeback error sequence (every handle's next sync
    /// reports it). For a caller that must stop holding newer bytes than storage now, whatever
    /// happens to them: returns the pages dropped.
    pub fn discard_dirty(&self, errno: i32) -> u64 {
        match &self.repr {
            Repr::Local { inner, .. } => inner.discard_dirty(errno),
            #[cfg(not(loom))]
            Repr::Client(client) => client.discard_dirty(errno),
        }
    }
}

/// The answers of a shared cache's owner to a client's file operations, and their encoding
/// (the owner encodes with these, the client decodes).
#[cfg(not(loom))]
pub(crate) mod answer {
    use super::{CachedRange, DropReport, PageState};
    use crate::inode::Revalidated;
    use crate::io::IoStats;
    use crate::mapping::MappingStats;
    use crate::stats::RaStats;

    fn w(words: &[u64], i: usize) -> u64 {
        words.get(i).copied().unwrap_or(0)
    }

    pub(crate) fn ra_stats(s: &RaStats) -> Vec<u64> {
        vec![
            s.sync_fresh,
            s.sync_context,
            s.sync_random,
            s.forced,
            s.async_pipelined,
            s.async_recovered,
            s.async_skipped,
            s.windows,
            s.pages,
            s.folios,
            s.marks,
            s.windows_at_eof,
            s.present_skips,
            s.order_fallbacks,
            s.batch_alloc_fallbacks,
            s.out_of_memory,
            s.read_folio,
            s.read_around,
            s.exec_windows,
            s.mmap_gave_up,
        ]
    }

    pub(crate) fn to_ra_stats(words: &[u64]) -> RaStats {
        RaStats {
            sync_fresh: w(words, 0),
            sync_context: w(words, 1),
            sync_random: w(words, 2),
            forced: w(words, 3),
            async_pipelined: w(words, 4),
            async_recovered: w(words, 5),
            async_skipped: w(words, 6),
            windows: w(words, 7),
            pages: w(words, 8),
            folios: w(words, 9),
            marks: w(words, 10),
            windows_at_eof: w(words, 11),
            present_skips: w(words, 12),
            order_fallbacks: w(words, 13),
            batch_alloc_fallbacks: w(words, 14),
            out_of_memory: w(words, 15),
            read_folio: w(words, 16),
            read_around: w(words, 17),
            exec_windows: w(words, 18),
            mmap_gave_up: w(words, 19),
        }
    }

    pub(crate) fn io_stats(s: &IoStats) -> Vec<u64> {
        vec![s.requests, s.bytes, s.errors, s.short_at_eof, s.by_caller]
    }

    pub(crate) fn to_io_stats(words: &[u64]) -> IoStats {
        IoStats {
            requests: w(words, 0),
            bytes: w(words, 1),
            errors: w(words, 2),
            short_at_eof: w(words, 3),
            by_caller: w(words, 4),
        }
    }

    pub(crate) fn mapping_stats(s: &MappingStats) -> Vec<u64> {
        vec![
            s.lookups,
            s.index_walks,
            s.lock_acquisitions,
            s.insertions,
            s.removals,
            s.cached_pages,
            s.index_nodes,
            s.index_bytes,
            s.optimistic_retries,
            s.dirty_pages,
            s.writeback_pages,
            s.unreferenced_hits,
            s.recent_hits,
        ]
    }

    pub(crate) fn to_mapping_stats(words: &[u64]) -> MappingStats {
        MappingStats {
            lookups: w(words, 0),
            index_walks: w(words, 1),
            lock_acquisitions: w(words, 2),
            insertions: w(words, 3),
            removals: w(words, 4),
            cached_pages: w(words, 5),
            index_nodes: w(words, 6),
            index_bytes: w(words, 7),
            optimistic_retries: w(words, 8),
            dirty_pages: w(words, 9),
            writeback_pages: w(words, 10),
            unreferenced_hits: w(words, 11),
            recent_hits: w(words, 12),
        }
    }

    pub(crate) fn revalidated(r: &Revalidated) -> Vec<u64> {
        vec![u64::from(r.changed), r.size, r.dropped_pages]
    }

    pub(crate) fn to_revalidated(words: &[u64]) -> Revalidated {
        Revalidated {
            changed: w(words, 0) != 0,
            size: w(words, 1),
            dropped_pages: w(words, 2),
        }
    }

    pub(crate) fn drop_report(r: &DropReport) -> Vec<u64> {
        vec![r.dropped_pages, r.busy_pages]
    }

    pub(crate) fn to_drop_report(words: &[u64]) -> DropReport {
        DropReport {
            dropped_pages: w(words, 0),
            busy_pages: w(words, 1),
        }
    }

    fn state_code(state: PageState) -> u64 {
        match state {
            PageState::Uptodate => 0,
            PageState::Dirty => 1,
            PageState::Writeback => 2,
            PageState::Reading => 3,
            PageState::Failed => 4,
        }
    }

    /// Ranges: `[count]`, then per range `[first, pages, folios, order, state, marks]` and the
    /// marks.
    pub(crate) fn ranges(ranges: &[CachedRange]) -> Vec<u64> {
        let mut out = vec![ranges.len() as u64];
        for r in ranges {
            out.extend([
                r.first,
                r.pages,
                r.folios,
                u64::from(r.largest_order),
                state_code(r.state),
                r.marks.len() as u64,
            ]);
            out.extend(&r.marks);
        }
        out
    }

    pub(crate) fn to_ranges(words: &[u64]) -> Vec<CachedRange> {
        let count = w(words, 0) as usize;
        let mut out = Vec::new();
        let mut i = 1;
        while out.len() < count && i + 6 <= words.len() {
            let marks = (w(words, i + 5) as usize).min(words.len().saturating_sub(i + 6));
            out.push(CachedRange {
                first: w(words, i),
                pages: w(words, i + 1),
                folios: w(words, i + 2),
                largest_order: w(words, i + 3).min(u64::from(crate::mem::MAX_ORDER)) as u8,
                state: match w(words, i + 4) {
                    0 => PageState::Uptodate,
                    1 => PageState::Dirty,
                    2 => PageState::Writeback,
                    3 => PageState::Reading,
                    _ => PageState::Failed,
                },
                marks: words[i + 6..i + 6 + marks].to_vec(),
            });
            i += 6 + marks;
        }
        out
    }
}

/// A shared cache client's file operations through the owner (`shared::wire::file_op`).
#[cfg(not(loom))]
impl ClientFile {
    fn op_words(&self, op: u64, a: u64, b: u64) -> Vec<u64> {
        self.file_op(op, a, b).map(|m| m.words).unwrap_or_default()
    }

    fn readahead_stats(&self) -> RaStats {
        answer::to_ra_stats(&self.op_words(crate::shared::wire::file_op::RA_STATS, 0, 0))
    }

    fn io_stats(&self) -> IoStats {
        answer::to_io_stats(&self.op_words(crate::shared::wire::file_op::IO_STATS, 0, 0))
    }

    fn wait_for_io(&self) {
        let _ = self.file_op(crate::shared::wire::file_op::WAIT_IO, 0, 0);
    }

    fn cached_ranges(&self) -> Vec<CachedRange> {
        answer::to_ranges(&self.op_words(crate::shared::wire::file_op::CACHED_RANGES, 0, 0))
    }

    fn drop_cached(&self, offset: u64, len: u64) -> DropReport {
        answer::to_drop_report(&self.op_words(
            crate::shared::wire::file_op::DROP_CACHED,
            offset,
            len,
        ))
    }

    fn revalidate(&self) -> Result<Revalidated, Error> {
        let answer = self.file_op(crate::shared::wire::file_op::REVALIDATE, 0, 0)?;
        Ok(answer::to_revalidated(&answer.words))
    }

    fn mapping_stats(&self) -> MappingStats {
        answer::to_mapping_stats(&self.op_words(crate::shared::wire::file_op::MAPPING_STATS, 0, 0))
    }

    fn written_outside(&self, offset: u64, len: u64) {
        let _ = self.file_op(crate::shared::wire::file_op::WRITTEN_OUTSIDE, offset, len);
    }

    fn changed_outside(&self) -> Result<Revalidated, Error> {
        let answer = self.file_op(crate::shared::wire::file_op::CHANGED_OUTSIDE, 0, 0)?;
        Ok(answer::to_revalidated(&answer.words))
    }

    fn discard_dirty(&self, errno: i32) -> u64 {
        self.op_words(
            crate::shared::wire::file_op::DISCARD_DIRTY,
            errno.unsigned_abs().into(),
            0,
        )
        .first()
        .copied()
        .unwrap_or(0)
    }
}

/// See [`File::cached_ranges`].
pub(crate) fn cached_ranges(mapping: &Mapping) -> Vec<CachedRange> {
    let mut out: Vec<CachedRange> = Vec::new();
    mapping.for_each_cached(0, u64::MAX, |folio| {
        let state = if folio.is_writeback() {
            PageState::Writeback
        } else if folio.is_dirty() {
            PageState::Dirty
        } else if folio.is_uptodate() {
            PageState::Uptodate
        } else if folio.test(crate::mem::flag::LOCKED) {
            PageState::Reading
        } else {
            PageState::Failed
        };
        let first = folio.index();
        let pages = folio.nr_pages() as u64;
        match out.last_mut() {
            Some(last) if last.first + last.pages == first && last.state == state => {
                last.pages += pages;
                last.folios += 1;
                last.largest_order = last.largest_order.max(folio.order());
            }
            _ => out.push(CachedRange {
                first,
                pages,
                folios: 1,
                largest_order: folio.order(),
                state,
                marks: Vec::new(),
            }),
        }
        if folio.test(crate::mem::flag::READAHEAD)
            && let Some(last) = out.last_mut()
        {
            last.marks.push(first);
        }
    });
    out
}

/// See [`File::drop_cached`].
pub(crate) fn drop_cached(inner: &Arc<Inode>, offset: u64, len: u64) -> DropReport {
    let mut report = DropReport::default();
    if inner.disk().is_none() {
        return report;
    }
    let mapping = &inner.mapping;
    let first = offset.div_ceil(PAGE_SIZE as u64);
    let end = if len == 0 {
        u64::MAX
    } else {
        match offset.checked_add(len) {
            Some(end) => end >> PAGE_SHIFT,
            None => u64::MAX,
        }
    };
    if end <= first {
        return report;
    }
    // Like the kernel's invalidation, the range's shadow entries go too: dropping a range
    // on purpose is not a sign of memory pressure, and a later read of it is no refault.
    mapping.drop_shadows_in(first, end - 1);
    mapping.for_each_cached(first, end - 1, |folio| {
        let whole = folio.index() >= first && folio.index() + folio.nr_pages() as u64 <= end;
        if !whole {
            return;
        }
        let pages = folio.nr_pages() as u64;
        if folio.test(crate::mem::flag::LOCKED) {
            report.busy_pages += pages;
            return;
        }
        match mapping.remove_folio(folio, None) {
            Ok(()) => report.dropped_pages += pages,
            Err(RemoveError::Busy(_) | RemoveError::Dirty(_)) => report.busy_pages += pages,
            Err(_) => {} // left the file meanwhile
        }
    });
    if inner.mapping.dirty_pages() > 0 {
        // As the kernel's `POSIX_FADV_DONTNEED`: start writing the dirty data, so that a
        // later drop finds it clean.
        let me: Arc<dyn crate::dirty::Flushable> = Arc::clone(inner) as _;
        inner
            .core
            .dirty
            .flush_soon(Arc::downgrade(&me), 0, u64::MAX);
    }
    report
}

/// Which steps of [`Handle::sync_range`] run, as `sync_file_range(2)`'s flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncRange(u8);

impl SyncRange {
    /// The flags from their bits (a shared cache's owner decoding a client's sync).
    pub(crate) fn from_bits(bits: u8) -> Self {
        Self(bits & 15)
    }

    /// Wait for writeback in flight in the range before starting any.
    pub const WAIT_BEFORE: Self = Self(1);
    /// Start writeback of the range's dirty data.
    pub const WRITE: Self = Self(2);
    /// Wait for the range's writeback to finish.
    pub const WAIT_AFTER: Self = Self(4);
    /// All three: write the range back and wait (an integrity sync of the range, without the
    /// file system's own sync).
    pub const ALL: Self = Self(7);
    /// With `WRITE`: write the range's dirty data into the kernel's page cache (a buffered
    /// write of the same inode) instead of to storage, and wait for that. The kernel then has
    /// the bytes as after a plain `write`: every reader of the file sees them, and they reach
    /// storage by the kernel's writeback or an fsync of the file. What a write-through cache
    /// needs to be seen by programs outside it, at a memory copy's cost rather than a device
    /// write's.
    pub const KERNEL: Self = Self(8);

    /// Whether every step of `other` is in `self`.
    pub fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for SyncRange {
    type Output = Self;
    fn bitor(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }
}

impl Handle {
    /// The file this handle reads.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Writes all of `data` at `pos` (see [`File::write_at`]). A handle writing sequentially
    /// (each write where the last one ended) has the data behind it written back in the
    /// background ([`CacheBuilder::write_behind_bytes`](crate::CacheBuilder::write_behind_bytes)).
    pub fn write_at(&mut self, data: &[u8], pos: u64) -> Result<usize, Error> {
        let written = self.file.write_at(data, pos)?;
        if self.file.local().is_some() {
            self.write_behind(pos, written as u64);
        }
        Ok(written)
    }

    /// Writes `data` at `pos` as [`write_at`](Self::write_at) does, then hands the written
    /// range to the kernel's page cache before returning ([`sync_range`](Self::sync_range)
    /// with `SyncRange::ALL | SyncRange::KERNEL`): what a write-through cache needs, so that
    /// programs reading the file without the cache see the bytes. On a shared cache both
    /// steps are one request to its owner. An error of the second step is returned even
    /// though the cache holds the bytes (they stay dirty for a later writeback when the
    /// policy keeps failed writes dirty).
    pub fn write_to_kernel_at(&mut self, data: &[u8], pos: u64) -> Result<usize, Error> {
        #[cfg(not(loom))]
        if let Repr::Client(client) = &self.file.repr {
            return client.write_at_to(data, pos, true);
        }
        let written = self.file.write_at(data, pos)?;
        if written > 0 {
            self.sync_range(pos, written as u64, SyncRange::ALL | SyncRange::KERNEL)?;
        }
        Ok(written)
    }

    /// Hands the data behind a sequential writer to the flusher, in `WRITE_BEHIND_ALIGN`
    /// units the stream wrote whole, once the write-behind trigger is reached.
    fn write_behind(&mut self, pos: u64, len: u64) {
        use crate::dirty::WRITE_BEHIND_ALIGN;
        let Some(inode) = self.file.local() else {
            return;
        };
        let trigger = inode.core.dirty.write_behind();
        // A file of whole-file commits is not written behind: each pass is a whole commit.
        let commits = inode.disk().is_some_and(|disk| disk.writer.is_some());
        if trigger == 0 || inode.disk().is_none() || commits || len == 0 {
            return;
        }
        if pos != self.stream.next {
            // A new stream begins here: only units it writes whole are ever behind it.
            self.stream.behind = pos.next_multiple_of(WRITE_BEHIND_ALIGN);
        }
        self.stream.next = pos.saturating_add(len);
        let done = self.stream.next - self.stream.next % WRITE_BEHIND_ALIGN;
        if done >= self.stream.behind.saturating_add(trigger) {
            let me: Arc<dyn crate::dirty::Flushable> = Arc::clone(inode) as _;
            inode.core.dirty.flush_soon(
                Arc::downgrade(&me),
                self.stream.behind >> PAGE_SHIFT,
                (done >> PAGE_SHIFT) - 1,
            );
            self.stream.behind = done;
        }
    }

    /// Writes back the file's dirty data, waits for it, and has the file system make the file
    /// durable (`fsync(2)`: data and metadata). Returns an error if writeback failed since
    /// this handle was created or last synced, once per error (the kernel's errseq: every
    /// handle open when the error happened is told once; a handle created later is told only
    /// if nobody was yet). Under the default
    /// [`WritebackErrorPolicy::KeepDirty`](crate::WritebackErrorPolicy::KeepDirty) the data of
    /// a failed write stays dirty and this call tries it again: `Ok` means everything dirty
    /// before the call is on storage. A memory file has nothing to sync.
    pub fn sync_all(&mut self) -> Result<(), Error> {
        self.sync(false)
    }

    /// As [`sync_all`](Self::sync_all), with `fdatasync(2)` (the file's timestamps may stay
    /// behind; its size and data do not).
    pub fn sync_data(&mut self) -> Result<(), Error> {
        self.sync(true)
    }

    fn sync(&mut self, data_only: bool) -> Result<(), Error> {
        #[cfg(not(loom))]
        if let Repr::Client(client) = &self.file.repr {
            return client.sync(u64::from(data_only), 0, 0, &mut self.wb_since);
        }
        let inode = self.file.inode();
        let Some(disk) = inode.disk() else {
            return Ok(());
        };
        if disk.direct.is_none() && disk.writer.is_none() {
            return Ok(());
        }
        if inode.writable().is_ok() {
            // A whole-file commit is durable when it returns: there is no fsync after it.
            inode.write_back_all()?;
            if let Some(direct) = &disk.direct
                && let Err(error) = direct.sync(data_only)
            {
                disk.wb
                    .errors
                    .set(error.raw_os_error().unwrap_or(libc::EIO));
            }
        }
        self.check_writeback_errors()
    }

    /// Writeback of `offset..offset + len` (0: to the end of the file), as
    /// `sync_file_range(2)`: `WRITE` alone starts it and returns at once (the flusher writes);
    /// with `WAIT_BEFORE` and `WAIT_AFTER` it waits for writeback in flight before and after;
    /// all three ([`SyncRange::ALL`]) write the range back and wait, like an integrity sync of
    /// it. It never asks the file system for durability (no `fsync`). Errors as for
    /// [`sync_all`](Self::sync_all).
    pub fn sync_range(&mut self, offset: u64, len: u64, flags: SyncRange) -> Result<(), Error> {
        #[cfg(not(loom))]
        if let Repr::Client(client) = &self.file.repr {
            return client.sync(2 + u64::from(flags.0), offset, len, &mut self.wb_since);
        }
        let inode = self.file.inode();
        let Some(disk) = inode.disk() else {
            return Ok(());
        };
        let first = offset >> PAGE_SHIFT;
        let last = if len == 0 {
            u64::MAX
        } else {
            (offset.saturating_add(len) - 1) >> PAGE_SHIFT
        };
        let wait = || drop(disk.wb.pass_lock());
        if flags.contains(SyncRange::WAIT_BEFORE) {
            wait();
        }
        if flags.contains(SyncRange::WRITE) && inode.writable().is_ok() {
            if flags.contains(SyncRange::KERNEL) {
                crate::writeback::write_back_to(
                    inode,
                    first,
                    last,
                    crate::writeback::SyncMode::All,
                    crate::writeback::Target::Kernel,
                )?;
            } else if flags == SyncRange::ALL {
                crate::writeback::write_back(inode, first, last, crate::writeback::SyncMode::All)?;
            } else if flags.contains(SyncRange::WAIT_AFTER) {
                crate::writeback::write_back(
                    inode,
                    first,
                    last,
                    crate::writeback::SyncMode::None(u64::MAX),
                )?;
            } else {
                // Start, do not wait: the flusher writes (no writeback in flight is waited for).
                let me: Arc<dyn crate::dirty::Flushable> = Arc::clone(inode) as _;
                inode
                    .core
                    .dirty
                    .flush_soon(Arc::downgrade(&me), first, last);
            }
        }
        if flags.contains(SyncRange::WAIT_AFTER) {
            wait();
        }
        self.check_writeback_errors()
    }

    /// The writeback error recorded since this handle last looked, once.
    fn check_writeback_errors(&mut self) -> Result<(), Error> {
        let Some(disk) = self.file.inode().disk() else {
            return Ok(());
        };
        match disk.wb.errors.check_and_advance(&mut self.wb_since) {
            None => Ok(()),
            Some(errno) => Err(Error::Writeback {
                source: std::io::Error::from_raw_os_error(errno),
            }),
        }
    }

    /// Reads up to `buf.len()` bytes at `pos`; fewer at end of file, 0 at or past it. Holes
    /// and folios that are not uptodate read as zeros. How the index is walked is the cache's
    /// [`ReadPolicy`] (see [`set_read_policy`](Self::set_read_policy)).
    ///
    /// For a file read from storage, a miss starts readahead (this handle's [`RaState`]) and
    /// waits for the device. A short count always means end of file: a device error is
    /// [`Error::Io`], whose `offset` is the first byte not read (the bytes of `buf` before
    /// `offset - pos` were filled), and a later read of that range tries the device again.
    pub fn read_at(&mut self, buf: &mut [u8], pos: u64) -> Result<usize, Error> {
        let inner = match &self.file.repr {
            Repr::Local { inner, .. } => inner,
            #[cfg(not(loom))]
            Repr::Client(client) => return client.read_at(&mut self.ra, buf, pos),
        };
        if inner.disk().is_some() {
            return read::read_disk_with(
                inner,
                (&self.policy, &mut self.recent),
                &mut self.ra,
                buf,
                pos,
            );
        }
        let n = read::read_at(
            inner,
            &self.policy,
            buf,
            pos,
            self.ra.prev_pos == pos as i64,
            &mut self.recent,
        )?;
        if n > 0 {
            self.ra.prev_pos = (pos + n as u64) as i64;
        }
        Ok(n)
    }

    /// [`read_at`](Self::read_at) that never waits for storage (the kernel's `IOCB_NOWAIT`
    /// with `IOCB_WAITQ`, how io_uring reads through the page cache): copies what is cached
    /// and, at the first folio that is not, starts the reads a blocking read would start
    /// (readahead included) and returns [`Error::WouldBlock`], whose `offset` is the first
    /// byte not copied (the bytes of `buf` before `offset - pos` were filled). The caller
    /// waits for the backend to complete a request, then reads again; an async read is built
    /// this way. `retry_failed`: whether a folio whose last read failed is read again (the
    /// first try of a read), or its failure returned as [`Error::Io`] (a try after the caller
    /// waited: the read it waited for failed).
    ///
    /// Only for a file read from storage in a private cache; a memory file never waits, so
    /// this is `read_at` for it.
    pub fn read_at_nowait(
        &mut self,
        buf: &mut [u8],
        pos: u64,
        retry_failed: bool,
    ) -> Result<usize, Error> {
        let inner = match &self.file.repr {
            Repr::Local { inner, .. } => inner,
            #[cfg(not(loom))]
            Repr::Client(_) => return Err(unsupported("a read that does not wait")),
        };
        if inner.disk().is_some() {
            return read::read_disk_waiting(
                inner,
                &mut self.ra,
                buf,
                pos,
                read::Wait::No { retry_failed },
            );
        }
        self.read_at(buf, pos)
    }

    /// This handle's readahead state (a copy).
    pub fn ra_state(&self) -> RaState {
        self.ra
    }

    /// Takes over a readahead state (a shared cache's owner running a client's read with the
    /// client's handle's state).
    pub(crate) fn set_ra_state(&mut self, ra: RaState) {
        self.ra = ra;
    }

    /// Where this handle is in the file's writeback errors (see `sync_all`).
    pub(crate) fn errseq_cursor(&self) -> u32 {
        self.wb_since
    }

    /// Moves this handle's errseq cursor (a shared cache's owner running a client's sync).
    pub(crate) fn set_errseq_cursor(&mut self, since: u32) {
        self.wb_since = since;
    }

    /// Sets this handle's maximum readahead window in bytes (rounded down to pages, clamped to
    /// [`MAX_READAHEAD_BYTES`](crate::MAX_READAHEAD_BYTES); 0 disables readahead), and makes
    /// it the one `Advice::Normal` restores.
    pub fn set_ra_bytes(&mut self, bytes: u64) {
        self.ra.ra_pages = bytes.min(crate::readahead::MAX_READAHEAD_BYTES) >> PAGE_SHIFT;
        self.ra.default_ra_pages = self.ra.ra_pages;
    }

    /// Advice on the access pattern (`posix_fadvise`). `WillNeed` starts reads and returns
    /// without waiting; `DontNeed` drops idle folios (see [`File::drop_cached`]).
    pub fn advise(&mut self, advice: Advice) -> Result<(), Error> {
        match advice {
            Advice::Normal => {
                self.ra.random = false;
                self.ra.ra_pages = self.ra.default_ra_pages;
            }
            Advice::Sequential => {
                self.ra.random = false;
                self.ra.ra_pages = self.ra.default_ra_pages.saturating_mul(2);
            }
            Advice::Random => self.ra.random = true,
            Advice::WillNeed { offset, len } => self.readahead(offset, len)?,
            Advice::DontNeed { offset, len } => {
                self.file.drop_cached(offset, len);
            }
        }
        Ok(())
    }

    /// Starts reading `offset..offset + len` into the cache without waiting, as `readahead(2)`:
    /// no heuristics, no marks, at most the larger of the window and the device's largest
    /// request, in 2 MiB chunks. A memory file has nothing to read: [`Error::NotADiskFile`].
    pub fn readahead(&mut self, offset: u64, len: u64) -> Result<(), Error> {
        #[cfg(not(loom))]
        if let Repr::Client(client) = &self.file.repr {
            return client.readahead(&mut self.ra, offset, len);
        }
        let inner = self.file.inode();
        let Some(disk) = inner.disk() else {
            return Err(Error::NotADiskFile);
        };
        if len == 0 {
            return Ok(());
        }
        let first = offset >> PAGE_SHIFT;
        let last = (offset.saturating_add(len) - 1) >> PAGE_SHIFT;
        let geometry = inner.geometry();
        let fill = readahead::force_fill(&self.ra, first, last - first + 1, &geometry);
        disk.ra.count(readahead::Trigger::Forced);
        readahead::fill(inner, &mut self.ra, fill);
        Ok(())
    }

    /// The bytes of `pos..pos + len` (clipped at end of file, and at
    /// [`MAX_READ_RUN`](crate::MAX_READ_RUN) bytes: a longer range gives a shorter run, and the
    /// caller reads on from its end) without copying them: a run of slices, each borrowing a
    /// referenced folio (or a shared zero buffer for holes). The folios stay pinned until the
    /// run is dropped.
    pub fn read_folios(&mut self, pos: u64, len: usize) -> Result<ReadRun<'_>, Error> {
        let len = len.min(read::MAX_READ_RUN);
        let inner = match &self.file.repr {
            Repr::Local { inner, .. } => inner,
            #[cfg(not(loom))]
            Repr::Client(_) => return Err(unsupported("a zero-copy read")),
        };
        if inner.disk().is_some() {
            return read::read_folios_disk(inner, &mut self.ra, pos, len);
        }
        read::read_folios(inner, pos, len)
    }

    /// Chooses how this handle's reads walk the index (the cache's policy by default): one
    /// binary, and even one file, can measure seed 004's before and after side by side.
    pub fn set_read_policy(&mut self, read: ReadPolicy) {
        self.policy.read = read;
    }

    /// Chooses whether this handle's small reads take a reference (the cache's policy by
    /// default).
    pub fn set_small_read_policy(&mut self, small_read: SmallReadPolicy) {
        self.policy.small_read = small_read;
    }

    /// The byte position just after the last successful read (0 before any).
    pub fn prev_pos(&self) -> u64 {
        self.ra.prev_pos.max(0) as u64
    }
}
