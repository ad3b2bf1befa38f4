//! foliocache: the Linux page-cache read path, in user space.
//!
//! A bounded arena of naturally aligned *folios* (`mem`), an xarray-like *index* per file with
//! lock-free lookups (`index`), and per-file *mappings* that pair them with the kernel's
//! speculative-reference protocol (`mapping`). Each optimisation from the four seed series keeps
//! its "before" variant as a runtime [`Policy`].
//!
//! ```
//! use foliocache::Cache;
//!
//! let cache = Cache::builder().capacity(1 << 20).build()?;
//! let file = cache.new_mapping();
//! let folio = cache.alloc_folio(2)?; // 16 KiB
//! file.add_folio(&folio, 4)?; // pages 4..8
//! folio.end_read(true); // filled: uptodate, unlocked
//! let found = file.lookup(6).expect("cached");
//! assert_eq!(found.id(), folio.id());
//! # Ok::<(), foliocache::Error>(())
//! ```

#![deny(missing_docs)]

#[cfg(not(target_pointer_width = "64"))]
compile_error!("foliocache needs a 64-bit target");

mod cache;
mod error;
pub mod fault;
pub mod file;
pub mod index;
pub mod io;
pub mod mapping;
pub mod mem;
pub mod read;
pub mod readahead;
pub mod reclaim;
mod sync;

pub use cache::{Cache, CacheBuilder, InsertPolicy, Policy, ReadPolicy, SmallReadPolicy, Stats};
pub use error::Error;
pub use fault::{Fault, Region, RegionHint};
pub use file::{Advice, CachedRange, File, Handle, PageState};
pub use io::{Backend, EngineKind, IoMode, IoStats, OpenOptions, ReadRequest};
pub use mapping::{FolioBatch, Mapping, MappingStats, MappingView};
pub use mem::refcount::RefcountPolicy;
pub use mem::{FolioRef, MAX_ORDER, PAGE_SIZE, flag};
pub use readahead::{RaState, RaStats};
pub use reclaim::ReclaimStats;
