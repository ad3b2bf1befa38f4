//! Counters, and the JSON written at exit when `FOLIOCACHE_STATS=PATH` is set.
//!
//! Each process that opened a file through the cache appends one JSON object on one line to
//! PATH (a `%p` in PATH is replaced by the process id), so a shell and the programs it starts
//! each leave their own line and none overwrites another's.
//!
//! Writes: `writes` counts the writes of served fds the library carried out (either mode);
//! `bytes_written_through` went to the kernel (write-through, or a write-back append through
//! a description another process shares), `bytes_written_to_cache` into the cache's dirty
//! folios. `writeback_pages` are the pages the cache wrote to storage (flusher, write-behind,
//! syncs, flush points, last close); `syncs` the fsync/fdatasync/sync_file_range calls the
//! cache served; `flushes` the flush points (mmap, fork, exec, locks, exit...) that wrote an
//! inode back.

use foliocache::File;
use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($name:ident),* $(,)?) => {
        #[allow(non_upper_case_globals)]
        mod counter {
            use std::sync::atomic::AtomicU64;
            $(pub(super) static $name: AtomicU64 = AtomicU64::new(0);)*
        }
        /// All counters, in order, with their names.
        fn all() -> Vec<(&'static str, &'static AtomicU64)> {
            vec![$((stringify!($name), &counter::$name)),*]
        }
    };
}

counters!(
    leases_taken,
    leases_broken,
    passthrough_reads,
    writes,
    bytes_written_through,
    bytes_written_to_cache,
    syncs,
    flushes,
    invalidations,
    files,
    retired_device_bytes,
    retired_device_requests,
    retired_misses,
    readahead_calls,
);

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// Shards of the counters every served read adds to, one cache line each: threads reading at
/// once add to different lines (a shared line would move between their CPUs on every read).
/// The threads numbered below this own one shard each; all later ones share the last.
const READ_SHARDS: usize = 16;

#[repr(align(128))]
struct ReadShard {
    reads: AtomicU64,
    bytes: AtomicU64,
}

static READ_COUNTS: [ReadShard; READ_SHARDS + 1] = [const {
    ReadShard {
        reads: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
    }
}; READ_SHARDS + 1];

/// A read served by the cache, of `bytes` bytes, counted in the shard of the thread numbered
/// `thread` (`hooks::thread_number`: no two threads have the same number). A thread with a shard
/// of its own adds with a load and a store, no locked instruction: no other thread writes
/// that shard, and the sum at exit reads it with the others. The shared shard adds atomically.
pub(crate) fn read_served(thread: usize, bytes: usize) {
    let (own, shared) = READ_COUNTS.split_at(READ_SHARDS);
    if let Some(own) = own.get(thread) {
        let bump = |counter: &AtomicU64, n: u64| {
            counter.store(
                counter.load(Ordering::Relaxed).wrapping_add(n),
                Ordering::Relaxed,
            );
        };
        bump(&own.reads, 1);
        bump(&own.bytes, bytes as u64);
    } else {
        add(&shared[0].reads, 1);
        add(&shared[0].bytes, bytes as u64);
    }
}

/// Served reads and their bytes, summed over the shards.
fn reads_served() -> (u64, u64) {
    READ_COUNTS.iter().fold((0, 0), |(reads, bytes), shard| {
        (
            reads + shard.reads.load(Ordering::Relaxed),
            bytes + shard.bytes.load(Ordering::Relaxed),
        )
    })
}

/// A read of an intercepted fd that went to the kernel.
pub(crate) fn read_passed_through() {
    add(&counter::passthrough_reads, 1);
}

/// A write of `bytes` bytes written through to the kernel.
pub(crate) fn written_through(bytes: u64) {
    add(&counter::writes, 1);
    add(&counter::bytes_written_through, bytes);
}

/// A write of `bytes` bytes into the cache (write-back mode).
pub(crate) fn written_to_cache(bytes: u64) {
    add(&counter::writes, 1);
    add(&counter::bytes_written_to_cache, bytes);
}

/// A sync served by the cache.
pub(crate) fn synced() {
    add(&counter::syncs, 1);
}

/// An inode written back at a flush point.
pub(crate) fn flushed() {
    add(&counter::flushes, 1);
}

pub(crate) fn invalidation() {
    add(&counter::invalidations, 1);
}

/// A `readahead(2)` or `POSIX_FADV_WILLNEED` from the program (each is one forced fill in the
/// file's counters, which is not a miss).
pub(crate) fn readahead_call() {
    add(&counter::readahead_calls, 1);
}

pub(crate) fn opened_file() {
    add(&counter::files, 1);
}

/// A lease taken on a file, so the cache may serve it.
pub(crate) fn lease_taken() {
    add(&counter::leases_taken, 1);
}

/// A lease broken (another process's open or truncate, or the program's own).
pub(crate) fn lease_broken() {
    add(&counter::leases_broken, 1);
}

/// Why a file passes through to the kernel (`passthrough` in the JSON, a count per reason:
/// each time a file starts passing through for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    /// Open elsewhere in a way no lease allows: for writing by another process (or for
    /// writing here beside a read-only description), or at all beside a writable one.
    Busy,
    /// Its lease was broken (the file passes through until a lease can be had again).
    Broken,
    /// A writable description of it went to another process (fork, a spawned program).
    Inherited,
    /// Mapped `MAP_SHARED` by the program.
    SharedMapping,
    /// The program's own O_DIRECT.
    ProgramDirect,
    /// No lease to be had: another user's file without `CAP_LEASE`, a file system without
    /// leases, leases disabled.
    NoLease,
    /// The file system has no direct I/O (tmpfs).
    NoDirectIo,
    /// The cache's I/O engine could not start (`FOLIOCACHE_IO=io_uring` where the kernel
    /// refuses io_uring).
    IoEngine,
    /// Opened write-only in write-through mode: nothing to cache.
    WriteOnly,
    /// No signal for lease breaks: the program uses it.
    Signal,
    /// Written or read through a path the library does not see (`fdopen`, fds 0-2 in
    /// write-back mode, an fd past the table, a nested write in write-back mode, the
    /// program's own lease or `F_SETOWN`).
    UntrackedPath,
    /// Its lease was released for an `exec` that failed.
    Exec,
    /// The process is exiting (write-back mode: what is written from now on goes to the
    /// kernel).
    Exit,
}

impl Reason {
    const ALL: [Reason; 13] = [
        Reason::Busy,
        Reason::Broken,
        Reason::Inherited,
        Reason::SharedMapping,
        Reason::ProgramDirect,
        Reason::NoLease,
        Reason::NoDirectIo,
        Reason::IoEngine,
        Reason::WriteOnly,
        Reason::Signal,
        Reason::UntrackedPath,
        Reason::Exec,
        Reason::Exit,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Reason::Busy => "busy",
            Reason::Broken => "broken",
            Reason::Inherited => "inherited",
            Reason::SharedMapping => "shared-mapping",
            Reason::ProgramDirect => "program-direct",
            Reason::NoLease => "no-lease",
            Reason::NoDirectIo => "no-direct-io",
            Reason::IoEngine => "io-engine",
            Reason::WriteOnly => "write-only",
            Reason::Signal => "signal",
            Reason::UntrackedPath => "untracked-path",
            Reason::Exec => "exec",
            Reason::Exit => "exit",
        }
    }
}

static PASSED: [AtomicU64; Reason::ALL.len()] = [const { AtomicU64::new(0) }; Reason::ALL.len()];

/// A file started passing through, for `reason`.
pub(crate) fn passed_through(reason: Reason) {
    add(&PASSED[reason as usize], 1);
}

/// Reads that missed and started device reads themselves, plus the program's own readahead
/// calls (forced fills; [`json`] takes those out again).
fn misses_of(file: &File) -> u64 {
    if let Some(misses) = file.process_misses() {
        return misses; // a shared cache's readahead counters are every process's
    }
    // (Forced readahead, the program's `readahead` and `WILLNEED`, is no read's miss.)
    let ra = file.readahead_stats();
    ra.sync_fresh + ra.sync_context + ra.sync_random
}

/// A `File` leaves: its counters are kept.
pub(crate) fn retire_file(file: &File) {
    let io = file.io_stats();
    add(&counter::retired_device_bytes, io.bytes);
    add(&counter::retired_device_requests, io.requests);
    add(&counter::retired_misses, misses_of(file));
}

/// In a child after fork: start from zero.
pub(crate) fn reset() {
    for (_, counter) in all() {
        counter.store(0, Ordering::Relaxed);
    }
    for counter in &PASSED {
        counter.store(0, Ordering::Relaxed);
    }
    for shard in &READ_COUNTS {
        shard.reads.store(0, Ordering::Relaxed);
        shard.bytes.store(0, Ordering::Relaxed);
    }
}

/// What the cache itself counted, for [`json`].
#[derive(Debug, Default, Clone)]
pub(crate) struct CacheCounters {
    pub(crate) evicted_pages: u64,
    pub(crate) writeback_pages: u64,
    /// A shared cache's own counters (a JSON object), beside the process's.
    pub(crate) shared: Option<String>,
}

/// The counters as one JSON object (`live` visits the files still open).
pub(crate) fn json(
    live: impl FnOnce(&mut dyn FnMut(&File)),
    cache: CacheCounters,
    program: &str,
) -> Option<String> {
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let passed: Vec<String> = Reason::ALL
        .iter()
        .filter(|reason| get(&PASSED[**reason as usize]) > 0)
        .map(|reason| format!("\"{}\":{}", reason.as_str(), get(&PASSED[*reason as usize])))
        .collect();
    if get(&counter::files) == 0 && passed.is_empty() {
        return None; // no file of the served directories was opened
    }
    let (mut device_bytes, mut device_requests, mut misses) = (
        get(&counter::retired_device_bytes),
        get(&counter::retired_device_requests),
        get(&counter::retired_misses),
    );
    live(&mut |file| {
        let io = file.io_stats();
        device_bytes += io.bytes;
        device_requests += io.requests;
        misses += misses_of(file);
    });
    let (reads, bytes_from_cache) = reads_served();
    let program = program.replace('\\', "\\\\").replace('"', "\\\"");
    Some(format!(
        "{{\"pid\":{},\"program\":\"{program}\",\"reads\":{reads},\"hits\":{},\"misses\":{misses},\
         \"bytes_from_cache\":{},\"bytes_from_device\":{device_bytes},\"device_requests\":{device_requests},\
         \"passthrough_reads\":{},\"readahead_calls\":{},\"files\":{},\"evicted_pages\":{},\"writes\":{},\
         \"bytes_written_through\":{},\"bytes_written_to_cache\":{},\"writeback_pages\":{},\
         \"syncs\":{},\"flushes\":{},\"invalidations\":{},\"leases_taken\":{},\"leases_broken\":{},\
         \"passthrough\":{{{}}}{}}}\n",
        std::process::id(),
        reads.saturating_sub(misses),
        bytes_from_cache,
        get(&counter::passthrough_reads),
        get(&counter::readahead_calls),
        get(&counter::files),
        cache.evicted_pages,
        get(&counter::writes),
        get(&counter::bytes_written_through),
        get(&counter::bytes_written_to_cache),
        cache.writeback_pages,
        get(&counter::syncs),
        get(&counter::flushes),
        get(&counter::invalidations),
        get(&counter::leases_taken),
        get(&counter::leases_broken),
        passed.join(","),
        cache
            .shared
            .as_ref()
            .map_or_else(String::new, |shared| format!(",\"shared\":{shared}")),
    ))
}
