//! Dirty memory control: how much of the cache may be dirty, the background flusher that
//! writes it out, and the throttling of writers (`mm/page-writeback.c`'s
//! `balance_dirty_pages`, `fs/fs-writeback.c`'s flusher; `docs/KERNEL.md`, "When writeback
//! runs" and "Dirty throttling").
//!
//! Thresholds are fractions of the cache's arena (the kernel's are of its dirtyable memory,
//! which the cache is): past the *background* threshold the flusher writes dirty files out;
//! between the *free-run* level (halfway from background to the limit) and the *limit*,
//! writers pause, by a cubic factor of how far past the *setpoint* (halfway from free-run to
//! the limit) dirty memory is and by how fast writeback completes; at the limit they wait for
//! writeback to bring dirty memory back under it. Below free run they never pause. Dirty
//! memory counted for throttling is dirty plus under writeback; for the background test,
//! dirty alone (as the kernel counts).
//!
//! The flusher is one thread per cache, started with the first dirty file. It wakes when
//! kicked (background threshold crossed, reclaim finding only dirty folios, `sync_range`
//! asking for an asynchronous start) and every writeback interval, to write files dirty for
//! longer than the expiry (the kernel's `dirty_expire_centisecs`, per file) and to bring dirty
//! memory under the background threshold, a bounded slice of each file in turn.

use crate::mapping::PageCounts;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

/// What the flusher needs of a dirty file.
pub(crate) trait Flushable: Send + Sync {
    /// Writes back up to `pages` pages of the dirty folios in pages `first..=last` (a
    /// background pass; `u64::MAX` pages: an integrity pass of the range); returns the pages
    /// written.
    fn flush(self: Arc<Self>, first: u64, last: u64, pages: u64) -> u64;
    /// When the file became dirty (`None`: it is clean).
    fn dirtied_when(&self) -> Option<Instant>;
}

/// The dirty-memory settings of a cache (see `CacheBuilder`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DirtySettings {
    /// Background writeback starts above this fraction of the arena.
    pub(crate) background_ratio: f64,
    /// Writers are throttled towards this fraction, and wait at it.
    pub(crate) ratio: f64,
    /// Dirty data older than this is written out by the flusher.
    pub(crate) expire: Duration,
    /// How often the flusher wakes on its own.
    pub(crate) interval: Duration,
    /// Write-behind: a handle writing sequentially has the flusher start writing the data
    /// behind it once this many bytes of it are dirty (0: off, as in the kernel).
    pub(crate) write_behind: u64,
}

impl Default for DirtySettings {
    fn default() -> Self {
        Self {
            background_ratio: 0.10,
            ratio: 0.20,
            expire: Duration::from_secs(30),
            interval: Duration::from_secs(5),
            write_behind: DEFAULT_WRITE_BEHIND,
        }
    }
}

/// The default write-behind trigger: 4 MiB.
pub(crate) const DEFAULT_WRITE_BEHIND: u64 = 4 << 20;

/// Write-behind ranges end on multiples of this (the largest folio), so that the folio a
/// sequential writer is filling is never put under writeback under its feet.
pub(crate) const WRITE_BEHIND_ALIGN: u64 = (crate::mem::PAGE_SIZE as u64) << crate::mem::MAX_ORDER;

/// The longest a throttled writer pauses at once (the kernel's `MAX_PAUSE`).
const MAX_PAUSE: Duration = Duration::from_millis(200);
/// Pages one background slice writes of a file before the flusher moves to the next.
const SLICE_PAGES: u64 = 1024;
/// Writeback bandwidth assumed before any was measured, in pages per second (100 MiB/s).
const INITIAL_BANDWIDTH: f64 = 25_600.0;

/// Dirty memory control of one cache (see the module documentation).
#[derive(Debug)]
pub(crate) struct Dirty {
    settings: DirtySettings,
    /// Pages dirty and under writeback in all of the cache's files.
    pub(crate) pages: Arc<PageCounts>,
    background: u64,
    limit: u64,
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    /// Writers waiting at the limit wait here for writeback completions.
    progress: Condvar,
    progress_lock: Mutex<()>,
    /// Pages whose writeback completed, ever (for the bandwidth estimate).
    written: AtomicU64,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

/// A request to write part of a file now.
struct Soon {
    file: Weak<dyn Flushable>,
    first: u64,
    last: u64,
}

#[derive(Default)]
struct State {
    /// Dirty files, in the order the flusher visits them.
    files: VecDeque<Weak<dyn Flushable>>,
    /// Ranges of files (pages `first..=last`) whose dirty data was asked to be written now
    /// (`sync_range` with WRITE alone, `drop_cached`, write-behind).
    soon: Vec<Soon>,
    kicked: bool,
    shutdown: bool,
    /// The bandwidth estimate: when it was last updated, `written` then, pages per second.
    bandwidth: Option<(Instant, u64, f64)>,
}

/// Counters of dirty memory control (a snapshot; part of [`Stats`](crate::Stats)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirtyStats {
    /// Pages dirty now.
    pub dirty_pages: u64,
    /// Pages under writeback now.
    pub writeback_pages: u64,
    /// The background threshold, in pages.
    pub background_pages: u64,
    /// The limit, in pages.
    pub limit_pages: u64,
    /// Pages whose writeback completed, ever.
    pub written_pages: u64,
}

impl Dirty {
    /// Control for an arena of `arena_pages` pages.
    pub(crate) fn new(settings: DirtySettings, arena_pages: u64) -> Self {
        let limit = ((arena_pages as f64 * settings.ratio) as u64).max(1);
        let mut background = (arena_pages as f64 * settings.background_ratio) as u64;
        if background >= limit {
            background = limit / 2; // as the kernel does
        }
        Self {
            settings,
            pages: Arc::default(),
            background,
            limit,
            shared: Arc::default(),
            thread: Mutex::new(None),
        }
    }

    fn dirty(&self) -> u64 {
        self.pages.dirty.load(Ordering::Relaxed)
    }

    fn dirty_and_writeback(&self) -> u64 {
        self.dirty() + self.pages.writeback.load(Ordering::Relaxed)
    }

    pub(crate) fn stats(&self) -> DirtyStats {
        DirtyStats {
            dirty_pages: self.dirty(),
            writeback_pages: self.pages.writeback.load(Ordering::Relaxed),
            background_pages: self.background,
            limit_pages: self.limit,
            written_pages: self.shared.written.load(Ordering::Relaxed),
        }
    }

    /// A file just became dirty: the flusher will visit it (started on first use).
    pub(crate) fn add_file(&self, file: Weak<dyn Flushable>) {
        self.lock_state().files.push_back(file);
        self.start();
    }

    /// Has the flusher write `file`'s dirty data now, without waiting for it.
    pub(crate) fn flush_soon(&self, file: Weak<dyn Flushable>, first: u64, last: u64) {
        let mut state = self.lock_state();
        // Write-behind asks for the next range of the same stream again and again: one pass
        // covers them all.
        match state
            .soon
            .iter_mut()
            .find(|soon| Weak::ptr_eq(&soon.file, &file))
        {
            Some(soon) => {
                soon.first = soon.first.min(first);
                soon.last = soon.last.max(last);
            }
            None => state.soon.push(Soon { file, first, last }),
        }
        drop(state);
        self.start();
        self.kick();
    }

    /// The write-behind trigger in bytes (0: off).
    pub(crate) fn write_behind(&self) -> u64 {
        self.settings.write_behind
    }

    /// Wakes the flusher now.
    pub(crate) fn kick(&self) {
        self.lock_state().kicked = true;
        self.shared.wake.notify_one();
    }

    /// Writeback of `pages` pages completed: counted for the bandwidth, and writers waiting at
    /// the limit look again.
    pub(crate) fn written(&self, pages: u64) {
        self.shared.written.fetch_add(pages, Ordering::Relaxed);
        let _lock = self
            .shared
            .progress_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.shared.progress.notify_all();
    }

    fn lock_state(&self) -> crate::sync::order::Ordered<std::sync::MutexGuard<'_, State>> {
        let order = crate::sync::order::taking(crate::sync::order::Rank::DirtyState);
        crate::sync::order::Ordered::new(
            self.shared
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
            order,
        )
    }

    fn start(&self) {
        let mut thread = self.thread.lock().unwrap_or_else(PoisonError::into_inner);
        if thread.is_some() {
            return;
        }
        let shared = Arc::clone(&self.shared);
        let pages = Arc::clone(&self.pages);
        let (settings, background) = (self.settings, self.background);
        let spawned = crate::mem::threads::spawn("foliocache-flush", move || {
            flusher(&shared, &pages, settings, background);
        });
        // Without a flusher, writers still write back when they wait at the limit and at sync
        // (`throttle` kicks nobody then, and waits with a timeout).
        *thread = spawned.ok();
    }

    /// Throttles a writer that is about to dirty `pages` pages (the kernel's
    /// `balance_dirty_pages`, see the module documentation). Never called with a folio lock
    /// held; the writer may hold its file's change lock, which writeback never takes.
    pub(crate) fn throttle(&self, pages: u64) {
        let freerun = (self.background + self.limit) / 2;
        loop {
            let dirty = self.dirty_and_writeback();
            if self.dirty() > self.background {
                self.kick();
            }
            if dirty + pages <= freerun {
                return;
            }
            if dirty >= self.limit {
                // At the limit: wait for writeback to bring dirty memory down.
                self.kick();
                let lock = self
                    .shared
                    .progress_lock
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let _ = self
                    .shared
                    .progress
                    .wait_timeout(lock, MAX_PAUSE)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            // Between free run and the limit: a pause that grows with the distance past the
            // setpoint (a cubic: twice the bandwidth's pace at free run, once at the setpoint,
            // nothing at the limit) and shrinks with the measured writeback bandwidth.
            let setpoint = (freerun + self.limit) as f64 / 2.0;
            let span = (self.limit - freerun).max(1) as f64;
            let x = ((setpoint - dirty as f64) / (span / 2.0)).clamp(-1.0, 1.0);
            let position = 1.0 + x * x * x;
            let rate = self.bandwidth() * position;
            let pause = if rate <= 0.0 {
                MAX_PAUSE
            } else {
                Duration::from_secs_f64(pages as f64 / rate).min(MAX_PAUSE)
            };
            std::thread::sleep(pause);
            return;
        }
    }

    /// Writeback bandwidth in pages per second, re-estimated at most every 200 ms from the
    /// completions counted by `written`, smoothed.
    fn bandwidth(&self) -> f64 {
        let written = self.shared.written.load(Ordering::Relaxed);
        let now = Instant::now();
        let mut state = self.lock_state();
        let (since, then, bw) = *state
            .bandwidth
            .get_or_insert((now, written, INITIAL_BANDWIDTH));
        let elapsed = now.duration_since(since);
        if elapsed >= Duration::from_millis(200) {
            let measured = (written - then) as f64 / elapsed.as_secs_f64();
            // Idle periods (nothing written) say nothing about the device: keep the estimate.
            let bw = if written > then {
                (bw * 3.0 + measured) / 4.0
            } else {
                bw
            };
            state.bandwidth = Some((now, written, bw));
            return bw;
        }
        bw
    }
}

impl Drop for Dirty {
    fn drop(&mut self) {
        self.lock_state().shutdown = true;
        self.shared.wake.notify_all();
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(thread) = thread
            && thread.thread().id() != std::thread::current().id()
        {
            let _ = thread.join();
        }
    }
}

type Files = Vec<Arc<dyn Flushable>>;
type Ranges = Vec<(Arc<dyn Flushable>, u64, u64)>;

/// The flusher thread (see the module documentation).
fn flusher(shared: &Shared, pages: &PageCounts, settings: DirtySettings, background: u64) {
    loop {
        // Files that leave the list: their last reference may be dropped only once the state
        // lock is released (dropping a file can end the cache, whose drop takes that lock).
        let mut leaving: Files = Vec::new();
        let (files, soon): (Files, Ranges) = {
            let _order = crate::sync::order::taking(crate::sync::order::Rank::DirtyState);
            let mut state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
            if !state.kicked && !state.shutdown {
                state = shared
                    .wake
                    .wait_timeout(state, settings.interval)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            if state.shutdown {
                return;
            }
            state.kicked = false;
            // Files still alive and dirty stay on the list; the others leave it.
            state.files.retain(|weak| match weak.upgrade() {
                Some(file) if file.dirtied_when().is_some() => true,
                Some(file) => {
                    leaving.push(file);
                    false
                }
                None => false,
            });
            let soon = state
                .soon
                .drain(..)
                .filter_map(|soon| Some((soon.file.upgrade()?, soon.first, soon.last)))
                .collect();
            (state.files.iter().filter_map(Weak::upgrade).collect(), soon)
        };
        drop(leaving);
        for (file, first, last) in soon {
            file.flush(first, last, u64::MAX - 1);
        }
        // Expired files first: everything they have.
        let now = Instant::now();
        for file in &files {
            if file
                .dirtied_when()
                .is_some_and(|when| now.duration_since(when) >= settings.expire)
            {
                Arc::clone(file).flush(0, u64::MAX, u64::MAX);
            }
        }
        // Then slices of each in turn, while dirty memory is above the background threshold.
        loop {
            let mut progress = 0;
            for file in &files {
                if pages.dirty.load(Ordering::Relaxed) <= background {
                    break;
                }
                progress += Arc::clone(file).flush(0, u64::MAX, SLICE_PAGES);
            }
            if progress == 0 || pages.dirty.load(Ordering::Relaxed) <= background {
                break;
            }
        }
    }
}
