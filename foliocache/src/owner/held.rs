//! The exact signal for opens from outside the cache while clients hold a file writable:
//! fanotify permission events (`docs/SHARED.md`, "Writers outside the cache"; the kernel side
//! is in `crate::io::fanotify`). It needs `CAP_SYS_ADMIN`; without it such files are watched
//! (`outside.rs`), which is not exact.
//!
//! A read lease ([`leases`](super::leases)) cannot be had on a file a client holds writable.
//! When a client holds a file writable, the owner marks the file's inode for `FAN_OPEN_PERM`
//! (once), then looks through `/proc` for a process outside the cache holding it open for
//! writing (a descriptor, or a shared writable mapping): every open after the mark waits for
//! the owner, so if none is found the file is exact from then on, and its record shows
//! `HELD`; if one is found it is only watched. An open is either a member's (the owner's,
//! or an attached process's: allowed at once) or an outside one. An outside open of a marked
//! file:
//!
//! 1. waits in the kernel while the owner blocks the clients' changes (`change_gate`), writes
//!    the file's dirty pages back, makes the record pass through (odd `serving`: clients read
//!    and write storage through their own descriptors, and the owner refuses a change that
//!    was on its way) and drops the file's pages;
//! 2. is then allowed, and the owner counts its description (by the opener's pid);
//! 3. when the last outside description is closed (a close event with that pid), the owner
//!    drops what may have been cached meanwhile and serves the file again.
//!
//! The event does not say whether the open is for reading or for writing, so a reader from
//! outside stops the serving too: exact, at the price of the pages. A process that opens a
//! file before it attaches counts as outside until it attaches (then its entries go).
//! Descriptions inherited by an unattached child and closed there last are not matched: the
//! file passes through until the owner ends (safe, slower). The events go to a reader thread
//! that never blocks (members' opens are answered there, so the owner's own opens during a
//! writeback cannot wait on themselves), and outside ones to a worker, in order.
//!
//! A dying owner's group closes with it and the kernel lets every waiting open go; the next
//! owner serves these files watched until a lease can be had again.

use super::{Owner, log};
use crate::io::fanotify::{Event, Group, Kind};
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use super::signal::LEASE;

/// The owner's fanotify group and what it holds.
pub(super) struct Held {
    group: Group,
    /// Record → the descriptor its inode was marked through.
    marks: Mutex<HashMap<usize, OwnedFd>>,
    /// Record → whether the file was exact when marked (see [`Owner::mark_held`]).
    exact: Mutex<HashMap<usize, bool>>,
    /// Record → the pids of the outside descriptions open on it (one entry each).
    outside: Mutex<HashMap<usize, Vec<i32>>>,
    /// Outside opens to the worker.
    to_worker: Mutex<Option<Sender<Event>>>,
    /// Outside opens held.
    pub(super) opens_held: AtomicU64,
    /// Total nanoseconds outside opens waited for the owner.
    pub(super) waited_ns: AtomicU64,
}

impl Held {
    /// The group, or why there is none (`EPERM`: no `CAP_SYS_ADMIN`).
    pub(super) fn new() -> std::io::Result<(Self, Receiver<Event>)> {
        let group = Group::new()?;
        let (tx, rx) = channel();
        Ok((
            Self {
                group,
                marks: Mutex::new(HashMap::new()),
                exact: Mutex::new(HashMap::new()),
                outside: Mutex::new(HashMap::new()),
                to_worker: Mutex::new(Some(tx)),
                opens_held: AtomicU64::new(0),
                waited_ns: AtomicU64::new(0),
            },
            rx,
        ))
    }

    fn marks(&self) -> std::sync::MutexGuard<'_, HashMap<usize, OwnedFd>> {
        self.marks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn exact(&self) -> std::sync::MutexGuard<'_, HashMap<usize, bool>> {
        self.exact.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn outside(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Vec<i32>>> {
        self.outside.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn is_marked(&self, record: usize) -> bool {
        self.marks().contains_key(&record)
    }
}

impl Owner {
    fn held(&self) -> Option<&Held> {
        self.held.as_ref()
    }

    /// Whether `pid` is the owner or an attached process.
    fn is_member(&self, pid: i32) -> bool {
        pid as u32 == std::process::id()
            || self.map.processes().iter().any(|p| {
                p.state.load(Ordering::Acquire) != 0 && p.pid.load(Ordering::Acquire) == pid as u32
            })
    }

    /// Marks `record`'s file for permission events, once, when a client holds it writable
    /// (under `turn`); returns whether the file is exact from here on: no process outside the
    /// cache had it open for writing when the mark was made (a descriptor with `O_WRONLY` or
    /// `O_RDWR`, or a shared writable mapping, as `/proc` shows them: [`written_outside`]).
    /// Every open after the mark waits for the owner, so nothing escapes between the mark
    /// and the look. A file written outside at that moment stays only watched.
    pub(super) fn mark_held(&self, record: usize) -> bool {
        let Some(held) = self.held() else {
            return false;
        };
        if let Some(&exact) = held.exact().get(&record) {
            return exact;
        }
        let Some((fd, path)) = self.open_record(record) else {
            return false;
        };
        let rec = &self.map.files()[record];
        let key = (
            rec.dev.load(Ordering::Acquire),
            rec.ino.load(Ordering::Acquire),
        );
        if let Err(e) = held.group.mark(fd.as_fd()) {
            log(
                &self.name,
                &format!(
                    "outside writers: no fanotify mark on {} ({e})",
                    path.display()
                ),
            );
            return false;
        }
        held.marks().insert(record, fd);
        let exact = !self.written_outside(key);
        if !exact {
            log(
                &self.name,
                &format!(
                    "outside writers: {} is open for writing outside the cache; watched only",
                    path.display()
                ),
            );
        }
        held.exact().insert(record, exact);
        exact
    }

    /// Whether a process outside the cache holds the file `key` open for writing, as far as
    /// `/proc` tells (a process it cannot look into counts as one that does).
    fn written_outside(&self, key: (u64, u64)) -> bool {
        use std::os::unix::fs::MetadataExt;
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return true;
        };
        for entry in procs.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            if self.is_member(pid) {
                continue;
            }
            let base = entry.path();
            let fds = match std::fs::read_dir(base.join("fd")) {
                Ok(fds) => fds,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue, // gone
                Err(_) => return true,
            };
            for fd in fds.flatten() {
                let Ok(meta) = std::fs::metadata(fd.path()) else {
                    continue;
                };
                if (meta.dev(), meta.ino()) != key {
                    continue;
                }
                let info = std::fs::read_to_string(base.join("fdinfo").join(fd.file_name()))
                    .unwrap_or_default();
                let flags = info
                    .lines()
                    .find_map(|l| l.strip_prefix("flags:"))
                    .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
                    .unwrap_or(u32::MAX);
                if flags & (libc::O_WRONLY | libc::O_RDWR) as u32 != 0 {
                    return true;
                }
            }
            // A shared writable mapping keeps a writable description without a descriptor
            // ("rw?s ... inode path" in maps; the inode alone is matched: a false match only
            // leaves the file watched).
            let maps = std::fs::read_to_string(base.join("maps")).unwrap_or_default();
            for line in maps.lines() {
                let mut parts = line.split_whitespace();
                let perms = parts.nth(1).unwrap_or("");
                let inode = parts.nth(2).and_then(|i| i.parse::<u64>().ok());
                if perms.as_bytes().get(1) == Some(&b'w')
                    && perms.as_bytes().get(3) == Some(&b's')
                    && inode == Some(key.1)
                {
                    return true;
                }
            }
        }
        false
    }

    /// `record`'s file leaves the cache: its mark and its outside openers are forgotten.
    pub(super) fn forget_held(&self, record: usize) {
        let Some(held) = self.held() else { return };
        if let Some(fd) = held.marks().remove(&record) {
            let _ = held.group.unmark(fd.as_fd());
        }
        held.exact().remove(&record);
        held.outside().remove(&record);
    }

    /// Whether an outside description of `record`'s file is open (the file passes through
    /// until the last one closes).
    pub(super) fn held_open_outside(&self, record: usize) -> bool {
        self.held()
            .is_some_and(|held| held.outside().get(&record).is_some_and(|p| !p.is_empty()))
    }

    /// An outside open of `record`'s file by `pid`, waiting in the kernel.
    fn outside_open(&self, record: usize, pid: i32) {
        let Some(held) = self.held() else { return };
        let _turn = self.leases.turn();
        let rec = &self.map.files()[record];
        // Counted whatever the file's state: a client may hold it writable a moment later,
        // and the file must not be served while this description is open.
        held.outside().entry(record).or_default().push(pid);
        if rec.signal.load(Ordering::Acquire) == LEASE
            || rec.serving.load(Ordering::Acquire) & 1 == 1
        {
            return; // the lease sees a writer's open itself; or passing through already
        }
        held.opens_held.fetch_add(1, Ordering::Relaxed);
        let file = self.served_file(record);
        // No client change runs from here on, and none starts: the write back below is the
        // last word of the cache on this file until it is served again.
        let _gate = self
            .change_gate
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(file) = &file
            && let Err(e) = file.sync_all()
        {
            log(
                &self.name,
                &format!("outside writers: writing record {record} back for an opener: {e}"),
            );
        }
        rec.serving.fetch_add(1, Ordering::SeqCst);
        if let Some(file) = &file
            && let Err(e) = file.changed_outside()
        {
            log(
                &self.name,
                &format!("outside writers: record {record}: {e}"),
            );
        }
    }

    /// The last close of an outside description of `record`'s file by `pid`.
    fn outside_closed(&self, record: usize, pid: i32) {
        let Some(held) = self.held() else { return };
        let _turn = self.leases.turn();
        let now_empty = {
            let mut outside = held.outside();
            let Some(pids) = outside.get_mut(&record) else {
                return;
            };
            let Some(at) = pids.iter().position(|&p| p == pid) else {
                return;
            };
            pids.swap_remove(at);
            pids.is_empty()
        };
        if now_empty {
            self.serve_again(record);
        }
    }

    /// `pid` attached: its descriptions are a member's now.
    pub(super) fn held_attached(&self, pid: u32) {
        let Some(held) = self.held() else { return };
        let _turn = self.leases.turn();
        let emptied: Vec<usize> = {
            let mut outside = held.outside();
            outside
                .iter_mut()
                .filter_map(|(&record, pids)| {
                    let before = pids.len();
                    pids.retain(|&p| p as u32 != pid);
                    (before > 0 && pids.is_empty()).then_some(record)
                })
                .collect()
        };
        for record in emptied {
            self.serve_again(record);
        }
    }

    /// Serves a held file that passed through again. Under `turn`.
    fn serve_again(&self, record: usize) {
        let rec = &self.map.files()[record];
        if rec.signal.load(Ordering::Acquire) == LEASE
            || rec.serving.load(Ordering::Acquire) & 1 == 0
        {
            return; // served already (a lease may have been had meanwhile)
        }
        if let Some(file) = self.served_file(record)
            && let Err(e) = file.changed_outside()
        {
            log(
                &self.name,
                &format!("outside writers: record {record}: {e}"),
            );
        }
        rec.serving.fetch_add(1, Ordering::AcqRel);
    }

    /// The record of the file an event's descriptor refers to.
    fn record_of(&self, event: &Event) -> Option<usize> {
        let st = rustix::fs::fstat(event.file.as_ref()?).ok()?;
        let record = self
            .cache
            .local()
            .and_then(|l| l.records())
            .and_then(|r| r.find((st.st_dev, st.st_ino)))?;
        self.held()?.is_marked(record).then_some(record)
    }
}

/// The reader thread: answers members' opens at once and hands the rest to the worker.
pub(super) fn read(owner: &Arc<Owner>) {
    let Some(held) = owner.held() else { return };
    let mut failures = 0u64;
    loop {
        let events = match held.group.read() {
            Ok(events) => events,
            Err(e) => {
                // Never give up: an open of a marked file waits for this thread's answer.
                if failures == 0 {
                    log(
                        &owner.name,
                        &format!("outside writers: fanotify failed: {e}"),
                    );
                }
                failures += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
        };
        for event in events {
            let member = owner.is_member(event.pid);
            match event.kind {
                Kind::Open if member => {
                    let _ = held.group.answer(&event);
                }
                Kind::Close if member => {}
                Kind::Overflow => log(
                    &owner.name,
                    "outside writers: fanotify's queue overflowed; files held for an outside \
                     opener may pass through until the owner ends",
                ),
                _ => {
                    let sent = held
                        .to_worker
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .as_ref()
                        .map(|tx| tx.send(event));
                    if let Some(Err(lost)) = sent {
                        // No worker: never leave an opener waiting.
                        let _ = held.group.answer(&lost.0);
                    }
                }
            }
        }
    }
}

/// The worker thread: stops serving a file for each outside open, then lets the open go on;
/// counts the closes.
pub(super) fn work(owner: &Arc<Owner>, events: &Receiver<Event>) {
    let Some(held) = owner.held() else { return };
    for event in events {
        let started = Instant::now();
        let record = owner.record_of(&event);
        match event.kind {
            Kind::Open => {
                if let Some(record) = record {
                    owner.outside_open(record, event.pid);
                }
                if let Err(e) = held.group.answer(&event) {
                    log(
                        &owner.name,
                        &format!("outside writers: answering an open: {e}"),
                    );
                }
                held.waited_ns
                    .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
            Kind::Close => {
                if let Some(record) = record {
                    owner.outside_closed(record, event.pid);
                }
            }
            Kind::Overflow => {}
        }
    }
}
