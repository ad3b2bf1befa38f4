//! The crate's one error type.

use std::io;

/// Everything that can go wrong, as values: bad input gets a clear message, never a panic.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The cache capacity is zero, not a multiple of the page size, or too large.
    #[error(
        "cache capacity must be a multiple of the page size (4096 bytes), at least 64 KiB and \
         at most 16 TiB; got {0} bytes"
    )]
    InvalidCapacity(u64),
    /// A shared cache's capacity too small for the mapping's fixed part (process and thread
    /// slots, file records, the arena's alignment) and an arena of 512 pages.
    #[error(
        "a shared cache needs a capacity of at least {minimum} bytes ({} MiB): its slots, file \
         records and alignment take {fixed} bytes before the first page of its arena; got \
         {capacity} bytes",
        minimum.div_ceil(1 << 20)
    )]
    SharedCapacityTooSmall {
        /// The capacity given.
        capacity: u64,
        /// The smallest a shared cache takes.
        minimum: u64,
        /// What the mapping's fixed part and slack take of it.
        fixed: u64,
    },
    /// A ratio outside `(0, 1]`.
    #[error("{name} = {ratio} is not in (0, 1]")]
    InvalidRatio {
        /// The setting.
        name: &'static str,
        /// The value given.
        ratio: f64,
    },
    /// A setting above its largest allowed value.
    #[error("{name} = {value} is above its largest allowed value, {max}")]
    InvalidSetting {
        /// The setting.
        name: &'static str,
        /// The value given.
        value: u64,
        /// The largest allowed.
        max: u64,
    },
    /// A folio (or index entry) order above the allowed maximum.
    #[error("order {order} is larger than the maximum {max}")]
    OrderTooLarge {
        /// The order asked for.
        order: u8,
        /// The largest allowed.
        max: u8,
    },
    /// A page index that is not a multiple of its folio's size.
    #[error("page index {index} is not aligned to an order-{order} folio ({} pages)", 1u128 << order)]
    Misaligned {
        /// The index.
        index: u64,
        /// The folio order.
        order: u8,
    },
    /// A page index (or byte offset) that runs past the largest page index.
    #[error("page index {index} with order {order} runs past the largest page index")]
    IndexOverflow {
        /// The index.
        index: u64,
        /// The folio order.
        order: u8,
    },
    /// The arena has no free block of the asked order (callers fall back or reclaim).
    #[error("out of memory: no free order-{order} folio in the cache")]
    NoMemory {
        /// The order asked for.
        order: u8,
    },
    /// The index could not allocate a node (its node limit was reached).
    #[error("out of memory: the index reached its node limit")]
    IndexNoMemory,
    /// A folio is already cached at (or covering) this index.
    #[error("a folio is already cached at page index {index}")]
    Exists {
        /// The first index of the folio found there.
        index: u64,
    },
    /// A replacement entry of another order than the entry it replaces.
    #[error("cannot replace an order-{old} entry with an order-{new} one")]
    OrderMismatch {
        /// The order of the entry in place.
        old: u8,
        /// The order of the replacement.
        new: u8,
    },
    /// A write or size past the largest file size.
    #[error("offset {offset} is past the largest file size (2^63 - 1 bytes)")]
    FileTooLarge {
        /// The offending end offset.
        offset: u64,
    },
    /// A memory file could not get the memory a change needs; the file is unchanged.
    #[error(
        "no space left in the cache for this change ({pages} pages needed); the file is unchanged"
    )]
    NoSpace {
        /// Pages the change needed.
        pages: u64,
    },
    /// The folio expected at this page index is not cached there (any more).
    #[error("no such folio cached at page index {index}")]
    NotCached {
        /// The page index.
        index: u64,
    },
    /// The folio is being written back; its bytes cannot be replaced until that ends.
    #[error("the folio at page index {index} is under writeback")]
    FolioWriteback {
        /// The page index.
        index: u64,
    },
    /// A value (shadow) entry larger than the index can hold.
    #[error("value {value} is larger than the largest value entry (2^56 - 1)")]
    ValueTooLarge {
        /// The value.
        value: u64,
    },
    /// A folio from another cache was handed to this one.
    #[error("the folio belongs to another cache")]
    ForeignFolio,
    /// A folio that is already in a mapping was inserted again.
    #[error("the folio is already in a mapping (id {mapping})")]
    FolioInUse {
        /// The mapping holding it.
        mapping: u64,
    },
    /// A folio that was in a mapping (and was truncated or replaced since) cannot be inserted
    /// again: allocate a new one.
    #[error("the folio was cached before; insert a newly allocated folio instead")]
    FolioWasCached,
    /// An uptodate folio cannot be inserted as one that reads as zeros.
    #[error("the folio is uptodate: it cannot be inserted as a folio that reads as zeros")]
    FolioUptodate,
    /// The folio is locked by another holder and cannot be inserted.
    #[error("the folio is locked by another holder")]
    FolioLocked,
    /// The cache's metadata (folio descriptors, allocator lists) could not be allocated.
    #[error("could not allocate {bytes} bytes of metadata for the cache")]
    MetadataAlloc {
        /// Bytes asked for.
        bytes: u64,
    },
    /// Reserving the arena failed.
    #[error("could not map {bytes} bytes for the arena: {source}")]
    Mmap {
        /// Bytes asked for.
        bytes: u64,
        /// The system's error.
        #[source]
        source: io::Error,
    },
    /// Faulting the arena in (`MADV_POPULATE_WRITE`) failed.
    #[error("could not prefault the arena: {0}")]
    Prefault(#[source] io::Error),
    /// A file could not be opened (or inspected).
    #[error("could not open {path}: {source}")]
    Open {
        /// The path.
        path: std::path::PathBuf,
        /// The system's error.
        #[source]
        source: io::Error,
    },
    /// The file system does not support direct I/O (O_DIRECT), or accepts it but caches anyway
    /// (tmpfs): reading through this cache would keep every byte twice. Open it with
    /// `OpenOptions::buffered_fallback(true)` to read through the kernel's cache explicitly.
    #[error(
        "{path} is on a file system without real direct I/O ({reason}); reading it through \
         foliocache would cache it twice. Use OpenOptions::buffered_fallback(true) to read it \
         through the kernel's page cache instead"
    )]
    NoDirectIo {
        /// The path.
        path: std::path::PathBuf,
        /// What was found.
        reason: String,
    },
    /// The file is already open in this cache with other layout options.
    #[error("cannot open {path} with these options: {reason}")]
    OpenConflict {
        /// The path.
        path: std::path::PathBuf,
        /// What conflicts.
        reason: String,
    },
    /// The device (or backend) failed to read file bytes.
    #[error("I/O error reading {len} bytes at offset {offset}: {source}")]
    Io {
        /// The file offset of the failed read.
        offset: u64,
        /// Its length.
        len: u64,
        /// The system's error.
        #[source]
        source: io::Error,
    },
    /// Writing dirty data back to storage failed (reported once to each handle, see
    /// [`Handle::sync_all`](crate::Handle::sync_all)).
    #[error("writeback failed: {source}")]
    Writeback {
        /// The system's error.
        #[source]
        source: io::Error,
    },
    /// The I/O engine could not be started.
    #[error("could not start the I/O engine: {0}")]
    Engine(#[source] io::Error),
    /// The operation needs a file backed by storage (a memory file has no device).
    #[error("this operation needs a file opened from storage, not a memory file")]
    NotADiskFile,
    /// A memory file operation was asked of a read-only file opened from storage.
    #[error("files opened from storage are read only in this cache")]
    ReadOnly,
    /// A fault outside its region or past end of file (the kernel's SIGBUS).
    #[error("page {index} is outside the region or past end of file")]
    FaultOutOfRange {
        /// The page index.
        index: u64,
    },
    /// A region of zero bytes.
    #[error("a region must cover at least one byte")]
    EmptyRegion,
    /// The file's descriptor was taken out ([`File::detach_descriptor`](crate::File::detach_descriptor)):
    /// nothing can be read from or written to storage until one is attached again.
    #[error("the file has no descriptor attached")]
    Detached,
    /// The operation needs the file clean, and it holds data not yet written back.
    #[error("the file holds {pages} pages not yet written back")]
    StillDirty {
        /// Dirty pages and pages under writeback.
        pages: u64,
    },
    /// A read that must not wait ([`Handle::read_at_nowait`](crate::Handle::read_at_nowait))
    /// reached a folio whose read is not done: the bytes before `offset` were copied, the
    /// reads that folio needs are started. Wait for them and read again.
    #[error("the read would wait for storage at offset {offset}")]
    WouldBlock {
        /// The first byte not copied.
        offset: u64,
    },
    /// A shared cache's mapping is not one this build can use (another layout version, a bad
    /// or corrupted header, a truncated or unsealed memfd) or holds a value out of bounds.
    #[error("shared cache mapping refused: {0}")]
    SharedMapping(String),
    /// Attaching to, starting or talking to a shared cache's owner process failed.
    #[error("shared cache {name}: {reason}")]
    Shared {
        /// The cache's name.
        name: String,
        /// What went wrong.
        reason: String,
    },
    /// The operation is not offered for a file whose backend takes changes as whole-file
    /// commits ([`WriteBackend`](crate::WriteBackend)): hole punching, `fallocate`, writing
    /// to the kernel's page cache.
    #[error("{what} is not offered for a file whose backend takes whole-file commits")]
    NotOffered {
        /// The operation.
        what: &'static str,
    },
    /// The operation is not offered by this kind of cache (a shared cache's clients have no
    /// zero-copy reads, memory files or internals; objects are not served shared yet).
    #[error("{what} is not available in a {mode} cache")]
    Unsupported {
        /// The operation.
        what: &'static str,
        /// "shared" or "private".
        mode: &'static str,
    },
}

/// A descriptor lent to the cache ([`Cache::open_descriptor`](crate::Cache::open_descriptor),
/// [`File::attach_descriptor`](crate::File::attach_descriptor)) that it refused: the error, and
/// the descriptor back, unclosed. Closing it is the caller's to time (closing any descriptor
/// of a file drops the process's POSIX record locks on it).
#[derive(Debug)]
pub struct DescriptorRefused {
    /// Why.
    pub error: Error,
    /// The descriptor, as it was lent.
    pub fd: std::os::fd::OwnedFd,
}

impl std::fmt::Display for DescriptorRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for DescriptorRefused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}
