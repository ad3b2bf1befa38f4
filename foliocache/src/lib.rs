//! foliocache: the Linux page cache, in user space.
//!
//! A bounded arena of naturally aligned *folios*, an xarray-like *index* per file with
//! lock-free lookups, the kernel's speculative-reference protocol, its readahead, reclaim and
//! workingset detection, for programs that read files with O_DIRECT (or keep data only in
//! memory) and want a private, bounded, observable cache with no syscall on a hit. Each
//! optimisation from the four seed series keeps its "before" variant as a runtime [`Policy`].
//!
//! ```no_run
//! use foliocache::{Advice, Cache};
//!
//! let cache = Cache::builder().capacity(256 << 20).build()?;
//! let file = cache.open("/var/lib/data/table.sst")?; // O_DIRECT underneath
//! let mut reader = file.handle(); // one reader's readahead state
//! reader.advise(Advice::Sequential)?;
//! let mut buf = vec![0u8; 8192];
//! let n = reader.read_at(&mut buf, 0)?; // a miss reads ahead; later reads hit
//! # let _ = n;
//! # Ok::<(), foliocache::Error>(())
//! ```
//!
//! Memory files keep their bytes only in the cache, like tmpfs:
//!
//! ```
//! use foliocache::Cache;
//!
//! let cache = Cache::builder().capacity(1 << 20).build()?;
//! let file = cache.create_memory_file(0)?;
//! file.write_at(b"hello", 4096)?;
//! let mut buf = [0u8; 5];
//! assert_eq!(file.read_at(&mut buf, 4096)?, 5);
//! assert_eq!(&buf, b"hello");
//! # Ok::<(), foliocache::Error>(())
//! ```
//!
//! The machinery underneath (mappings, the index, folio locks, the device probe, fault
//! injection) is in `foliocache::raw`, behind the `internals` feature: for the project's own
//! benchmarks, tests and tools, not part of the stable API.

#![deny(missing_docs)]
// Without the `internals` feature, what only `raw` exposes (index walks, folio guards, the
// probe...) is unused: not dead, unexported. The workspace's own builds turn the feature on
// (fcache, the tests), and there unused code is still reported.
#![cfg_attr(not(feature = "internals"), allow(dead_code, unreachable_pub))]

#[cfg(not(target_pointer_width = "64"))]
compile_error!("foliocache needs a 64-bit target");

mod cache;
mod core;
mod dirty;
mod error;
mod fault;
mod file;
#[cfg(not(loom))]
pub mod fork;
mod index;
mod inject;
mod inode;
mod io;
mod mapping;
mod mem;
mod memfile;
mod opened;
#[cfg(not(loom))]
mod owner;
mod policy;
#[cfg(feature = "internals")]
pub mod raw;
mod read;
mod readahead;
mod reclaim;
#[cfg(not(loom))]
mod shared;
mod stats;
mod sync;
mod wbstate;
mod write;
mod writeback;

pub use cache::{Cache, CacheBuilder, Stats};
pub use dirty::DirtyStats;
pub use error::{DescriptorRefused, Error};
pub use fault::{Fault, Region, RegionHint};
pub use file::{Advice, CachedRange, DropReport, File, Handle, PageState, SyncRange};
pub use inode::Revalidated;
pub use io::{
    Backend, Changes, EngineKind, FileStamp, IoMode, IoStats, OpenOptions, ReadRequest,
    WriteBackend,
};
pub use mapping::MappingStats;
pub use mem::epoch::{BARRIER_VAR as EPOCH_BARRIER_VAR, Barrier as EpochBarrier};
pub use mem::folio::{SEQ_PREFETCH_VAR, sequential_prefetch};
pub use mem::{FolioRef, MAX_ORDER, PAGE_SIZE};
pub use memfile::MAX_FILE_SIZE;
pub use policy::{
    InsertPolicy, Policy, ReadPolicy, ReclaimPolicy, RefcountPolicy, SmallReadPolicy,
    WritebackErrorPolicy,
};
pub use read::{HIT_READ_MAX, MAX_READ_RUN, ReadRun, SMALL_READ_MAX, Slice};
pub use readahead::{MAX_READAHEAD_BYTES, RaState};
pub use reclaim::ReclaimStats;
pub use stats::RaStats;

/// How this process's lockless readers publish their epoch pins (set by
/// [`EPOCH_BARRIER_VAR`]). The choice is made once, on the first use of the epochs; making it
/// early, while the process has one thread, makes registering for `membarrier` cheap (a few
/// microseconds, against a grace period of the kernel's once other threads run).
/// [`CacheBuilder::build`] makes it before the cache starts threads of its own.
pub fn epoch_barrier() -> EpochBarrier {
    mem::epoch::barrier()
}

/// The shared cache's owner program (`foliocache-owner`): its whole `main`. Programs do not
/// call it; the binary of that name does.
#[cfg(not(loom))]
#[doc(hidden)]
pub use owner::main as owner_main;
#[cfg(not(loom))]
pub use shared::admin::{CacheCommand, cache_command};
#[cfg(not(loom))]
pub use shared::client::starting_owner;
