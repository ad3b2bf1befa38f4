//! Writers outside the cache (`docs/SHARED.md`, "Writers outside the cache"): a program that
//! does not use the cache can still change a file the cache serves.
//!
//! The owner watches every file it serves with inotify (`IN_MODIFY`, `IN_ATTRIB`,
//! `IN_CLOSE_WRITE`) and, for each burst of events on a file, revalidates it: the file's stamp
//! on storage (size, modification and change times) against the one the cache last saw, so
//! the owner's own writes (which raise the same events) change nothing, and anyone else's drop
//! the file's clean pages and take its size from storage (dirty pages stay, as in a
//! revalidation on open). A queue overflow (`IN_Q_OVERFLOW`) may have hidden any event: every
//! served file is then treated as changed.
//!
//! This is not an exact signal: an event comes after the write returned, so a reader can see
//! the old bytes for the time the event takes to reach this thread and the revalidation to
//! drop the pages (`fcache cache status` counts the events and the changes found), and a
//! write through a shared `mmap` raises no event at all. Where the system has no event for a
//! change, the next open of the file revalidates it.

use super::{Owner, log};
use rustix::fs::inotify;
use std::collections::{BTreeSet, HashMap};
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// The owner's inotify instance and what its watches stand for.
pub(super) struct Outside {
    fd: OwnedFd,
    /// Watch descriptor → the records it stands for (hard links share one watch).
    watches: Mutex<HashMap<i32, Vec<usize>>>,
    /// Events read.
    pub(super) events: AtomicU64,
    /// Revalidations after an event that found the file changed by someone else.
    pub(super) changes: AtomicU64,
    /// Queue overflows (every served file treated as changed).
    pub(super) overflows: AtomicU64,
}

impl Outside {
    pub(super) fn new() -> std::io::Result<Self> {
        let fd = inotify::init(inotify::CreateFlags::CLOEXEC)?;
        Ok(Self {
            fd,
            watches: Mutex::new(HashMap::new()),
            events: AtomicU64::new(0),
            changes: AtomicU64::new(0),
            overflows: AtomicU64::new(0),
        })
    }

    /// Watches `path`, the file of `record` (which the owner just opened through it).
    pub(super) fn watch(&self, record: usize, path: &Path) -> std::io::Result<()> {
        let wd = inotify::add_watch(
            &self.fd,
            path,
            inotify::WatchFlags::MODIFY
                | inotify::WatchFlags::ATTRIB
                | inotify::WatchFlags::CLOSE_WRITE,
        )?;
        let mut watches = self.watches.lock().unwrap_or_else(PoisonError::into_inner);
        let records = watches.entry(wd).or_default();
        if !records.contains(&record) {
            records.push(record);
        }
        Ok(())
    }
}

impl Outside {
    /// `record`'s file left the cache: its watch no longer stands for it.
    pub(super) fn forget(&self, record: usize) {
        let mut watches = self.watches.lock().unwrap_or_else(PoisonError::into_inner);
        for records in watches.values_mut() {
            records.retain(|&r| r != record);
        }
        watches.retain(|_, records| !records.is_empty());
    }
}

/// The watcher thread: reads events, and after each read revalidates every file they named
/// (once per file, however many events it had).
pub(super) fn run(owner: &Arc<Owner>, outside: &Outside) {
    let mut buf = vec![MaybeUninit::<u8>::uninit(); 64 << 10];
    let mut reader = inotify::Reader::new(&outside.fd, &mut buf);
    loop {
        let mut touched = BTreeSet::new();
        let mut overflow = false;
        loop {
            let (wd, flags) = match reader.next() {
                Ok(event) => (event.wd(), event.events()),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    log(
                        &owner.name,
                        &format!("outside writers: inotify failed: {e}"),
                    );
                    return;
                }
            };
            outside.events.fetch_add(1, Ordering::Relaxed);
            if flags.contains(inotify::ReadFlags::QUEUE_OVERFLOW) {
                overflow = true;
            } else if flags.contains(inotify::ReadFlags::IGNORED) {
                // The file is gone (deleted, or its file system unmounted): the watch is.
                outside
                    .watches
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&wd);
            } else if let Some(records) = outside
                .watches
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&wd)
            {
                touched.extend(records.iter().copied());
            }
            if reader.is_buffer_empty() {
                break;
            }
        }
        if overflow {
            outside.overflows.fetch_add(1, Ordering::Relaxed);
            log(
                &owner.name,
                "outside writers: the event queue overflowed; every served file is treated as \
                 changed",
            );
            for file in owner.served_files() {
                if file.changed_outside().is_ok() {
                    outside.changes.fetch_add(1, Ordering::Relaxed);
                }
            }
            continue;
        }
        let mut changed = false;
        for record in touched {
            let Some(file) = owner.served_file(record) else {
                continue;
            };
            match file.revalidate() {
                Ok(r) if r.changed => {
                    changed = true;
                    outside.changes.fetch_add(1, Ordering::Relaxed);
                }
                Ok(_) => {}
                Err(e) => log(
                    &owner.name,
                    &format!("outside writers: revalidating record {record}: {e}"),
                ),
            }
        }
        if !changed {
            // Most likely the owner's own writes: let the next ones queue up unread for a
            // moment (see `QUIET_PAUSE`).
            std::thread::sleep(QUIET_PAUSE);
        }
    }
}

/// How long the watcher waits before reading again after a burst of events that changed
/// nothing. The owner's own writes raise events too, and a watcher blocked in `read` is woken
/// by each one: a thread switch per client write (with the pause, a loop of 8 KiB writes cost
/// the owner 520 ms of CPU per 48,192 writes instead of 660–730 ms, and 9–10 µs per write
/// instead of 10.5–14.7 on a 2-CPU machine). While
/// the watcher sleeps, events queue without waking anyone (inotify merges repeats), and the
/// next read takes them all. An outside write that lands in a pause is seen up to this much
/// later; one after a quiet spell is seen as before.
const QUIET_PAUSE: std::time::Duration = std::time::Duration::from_millis(1);
