//! Faults armed on purpose, for tests: allocation failures, I/O errors, short reads and panics
//! on the I/O completion path. Each cache has its own set (tests running in parallel do not
//! disturb each other), armed through [`crate::raw::Injector`]. When nothing is armed, the
//! cost on the paths that check is one relaxed load of a word that is never written.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The faults armed on one cache (counts of events still to fault).
#[derive(Debug, Default)]
pub(crate) struct Inject {
    /// Set while any count below is nonzero (the fast-path check).
    armed: AtomicU32,
    /// Folio allocations to fail with `NoMemory`.
    pub(crate) alloc_failures: AtomicU32,
    /// I/O completions (reads or writes by the engine) to turn into `EIO`.
    pub(crate) io_errors: AtomicU32,
    /// I/O completions to cut short: the engine sees only this many bytes (then continues the
    /// rest as it would after a real short transfer).
    pub(crate) short_transfers: AtomicU32,
    /// The byte count a cut-short completion reports (at most the request's length minus one).
    pub(crate) short_bytes: AtomicU64,
    /// Completions whose processing panics (inside the engine's completion path).
    pub(crate) completion_panics: AtomicU32,
    /// Write completions to turn into `ENOSPC`.
    pub(crate) nospace_errors: AtomicU32,
    /// Events faulted so far, all kinds together.
    pub(crate) fired: AtomicU64,
}

impl Inject {
    /// Whether anything is armed (one relaxed load).
    #[inline]
    pub(crate) fn armed(&self) -> bool {
        self.armed.load(Ordering::Relaxed) != 0
    }

    pub(crate) fn arm(&self, counter: &AtomicU32, n: u32) {
        counter.store(n, Ordering::Relaxed);
        self.armed.fetch_add(1, Ordering::Relaxed);
    }

    /// An errno for the next write, if an I/O error or a no-space error is armed.
    pub(crate) fn take_write_error(&self) -> Option<i32> {
        if self.take(&self.io_errors) {
            Some(libc::EIO)
        } else if self.take(&self.nospace_errors) {
            Some(libc::ENOSPC)
        } else {
            None
        }
    }

    /// Consumes one event of `counter` if any is left.
    pub(crate) fn take(&self, counter: &AtomicU32) -> bool {
        if !self.armed() {
            return false;
        }
        let taken = counter
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        if taken {
            self.fired.fetch_add(1, Ordering::Relaxed);
        }
        taken
    }
}

/// Named points where a test kills the process that reaches them: a shared cache's owner
/// started with `FOLIOCACHE_KILL_AT=POINT:MARKER` SIGKILLs itself at `POINT` if it can remove
/// the file `MARKER` (so exactly one process dies there, once, however many owners follow).
/// Only an owner arms them ([`arm_kill_points_from_env`]); anywhere else, and in an owner
/// without the variable, a point costs one relaxed load of a word that is never written.
///
/// The points: `fill` (folios locked for a read, the reads submitted), `get-put` (a folio
/// referenced by a lookup, before the caller's put), `index-lock` (holding a file's index
/// writer lock), `insert` (a folio prepared for an index, not yet in it), `writeback` (folios
/// under writeback, before their writes go out), `records` (holding the file table's lock),
/// `takeover` (a new owner, halfway through taking over a dead one's mapping).
///
/// The same points can pause instead: with `FOLIOCACHE_PAUSE_AT=POINT:MARKER` the owner
/// thread that reaches `POINT` first removes `MARKER` and waits until the test writes it
/// again, 20 s at most (once per process): how a test makes something happen while the owner
/// stands at a point. Two more points serve this: `claim` (a thread slot's claim checked, the
/// slot found without a staging folio, none given yet) and `release` (a process's release of a
/// thread slot read from its connection, not yet checked).
///
/// A client arms the points whose names start with `client-` ([`arm_client_points_from_env`]):
/// `client-claimed` (a thread slot's claim word taken in the mapping, the claim not yet sent
/// to the owner).
pub(crate) mod kill {
    use std::path::PathBuf;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicBool, Ordering};

    static ARMED: AtomicBool = AtomicBool::new(false);
    static AT: OnceLock<(String, PathBuf)> = OnceLock::new();
    static PAUSE_AT: OnceLock<(String, PathBuf)> = OnceLock::new();
    /// The pause point was reached once (it pauses once per process).
    static PAUSED: AtomicBool = AtomicBool::new(false);

    /// Arms the points named by `FOLIOCACHE_KILL_AT` and `FOLIOCACHE_PAUSE_AT` (an owner calls
    /// this when it starts).
    pub(crate) fn arm_kill_points_from_env() {
        arm(|_| true);
    }

    /// Arms the client's points (`client-…`) named by the same variables: a client calls this
    /// when it attaches. The owner's points stay the owner's: a client that shares their code
    /// never dies at one.
    pub(crate) fn arm_client_points_from_env() {
        arm(|point| point.starts_with("client-"));
    }

    fn arm(wanted: impl Fn(&str) -> bool) {
        for (variable, at) in [
            ("FOLIOCACHE_KILL_AT", &AT),
            ("FOLIOCACHE_PAUSE_AT", &PAUSE_AT),
        ] {
            let Some(value) = std::env::var_os(variable) else {
                continue;
            };
            let value = value.to_string_lossy().into_owned();
            if let Some((point, marker)) = value.split_once(':')
                && wanted(point)
                && at.set((point.to_owned(), PathBuf::from(marker))).is_ok()
            {
                ARMED.store(true, Ordering::Relaxed);
            }
        }
    }

    /// A point named `name` (see the module's `kill` documentation).
    #[inline]
    pub(crate) fn point(name: &'static str) {
        if ARMED.load(Ordering::Relaxed) {
            reached(name);
        }
    }

    #[cold]
    fn reached(name: &'static str) {
        if let Some((point, marker)) = AT.get()
            && point == name
            && std::fs::remove_file(marker).is_ok()
        {
            let _ = rustix::process::kill_process(
                rustix::process::getpid(),
                rustix::process::Signal::KILL,
            );
            // The signal is not blocked: nothing runs after it.
        }
        if let Some((point, marker)) = PAUSE_AT.get()
            && point == name
            && !PAUSED.swap(true, Ordering::Relaxed)
            && std::fs::remove_file(marker).is_ok()
        {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while !marker.exists() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
    }
}
