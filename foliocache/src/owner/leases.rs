//! The exact signal for writers outside the cache: read leases (`docs/SHARED.md`, "Writers
//! outside the cache"; the kernel side is in `crate::io::lease`).
//!
//! While no process holds a file open for writing (clients and owner included), the owner
//! holds a read lease on a descriptor of its own. A file is in one of three states, which its
//! record shows (`serving`: even serves, odd passes through; `signal`: `LEASE`, `WATCH`):
//!
//! * **leased**: served from the cache; an open for writing anywhere is held by the kernel
//!   until the owner has stopped serving the file;
//! * **passing through**: the lease broke. Before giving it up, the owner wrote the file's
//!   dirty pages back, made the record's serving state odd (read-only clients read storage
//!   through their own descriptors from then on) and dropped the file's pages. Only then does
//!   the opener go on, so no reader gets old bytes after the writer's open returned. The
//!   owner tries the lease again every tick; once it has it, no writer is left, and it drops
//!   whatever was cached meanwhile and serves the file again;
//! * **watched**: no lease can be had (a client holds the file writable, or the owner may not
//!   lease it): inotify and revalidation on open, which are not exact (`outside.rs`).
//!
//! A client's own open for writing breaks the lease too (the kernel cannot tell it from an
//! outside one): the file passes through until the client's open reaches the owner, which
//! then serves it watched. So a read-only file that a client later opens for writing loses
//! its clean pages once.
//!
//! All transitions of all files take one lock (`turn`), so a break, a new lease and a
//! client's open never interleave on one file. The lease thread never holds a lock a thread
//! blocked in `open` (held by one of our leases) can hold: the owner ends its own lease
//! before it opens a file for writing.
//!
//! A dying owner's leases go with its descriptors; the next owner serves every file watched
//! until it takes a lease of its own (`takeover`).

use super::{Owner, log};
use crate::io::lease;
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::signal::{HELD, LEASE, WATCH};

/// The owner's leases.
#[derive(Default)]
pub(super) struct Leases {
    /// Record → the descriptor the lease is on.
    held: Mutex<HashMap<usize, OwnedFd>>,
    /// Held across every transition (see the module documentation).
    turn: Mutex<()>,
    /// Leases taken.
    pub(super) taken: AtomicU64,
    /// Leases broken (by any open for writing, a client's included).
    pub(super) breaks: AtomicU64,
    /// Attempts refused for a reason other than a writer (`EACCES`: a file the owner's user
    /// does not own, without `CAP_LEASE`).
    pub(super) refused: AtomicU64,
}

impl Leases {
    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<usize, OwnedFd>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn turn(&self) -> std::sync::MutexGuard<'_, ()> {
        self.turn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the owner holds a lease on `record`'s file.
    pub(super) fn holds(&self, record: usize) -> bool {
        self.held().contains_key(&record)
    }
}

impl Owner {
    /// Tries to lease `record`'s file (after a read-only open, and every tick while it passes
    /// through). Nothing happens if a lease is held, or if any process holds the file open for
    /// writing.
    pub(super) fn try_lease(&self, record: usize) {
        let leases = &self.leases;
        let _turn = leases.turn();
        if leases.holds(record) {
            return;
        }
        let Some(file) = self.served_file(record) else {
            return;
        };
        let rec = &self.map.files()[record];
        let Some((fd, path)) = self.open_record(record) else {
            return;
        };
        match lease::take_read(fd.as_fd()) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => return,
            Err(e) => {
                if leases.refused.fetch_add(1, Ordering::Relaxed) == 0 {
                    log(
                        &self.name,
                        &format!(
                            "outside writers: no lease on {} ({e}); inotify only",
                            path.display()
                        ),
                    );
                }
                return;
            }
        }
        leases.taken.fetch_add(1, Ordering::Relaxed);
        // No writer now, and none until the lease breaks. Anything cached while the file
        // passed through may predate a writer's last change: drop it, take the size from
        // storage, then serve.
        if rec.serving.load(Ordering::Acquire) & 1 == 1 {
            if let Err(e) = file.changed_outside() {
                log(
                    &self.name,
                    &format!("outside writers: {}: {e}", path.display()),
                );
            }
            rec.serving.fetch_add(1, Ordering::AcqRel);
        }
        rec.signal.store(LEASE, Ordering::Release);
        leases.held().insert(record, fd);
    }

    /// A read-only descriptor of `record`'s file, opened by its path and checked to be the
    /// same inode (`None`: no path, or the path names another file now), and the path.
    pub(super) fn open_record(&self, record: usize) -> Option<(OwnedFd, std::path::PathBuf)> {
        let rec = &self.map.files()[record];
        let path = rec.path()?;
        let key = (
            rec.dev.load(Ordering::Acquire),
            rec.ino.load(Ordering::Acquire),
        );
        let fd = std::fs::File::open(&path).map(OwnedFd::from).ok()?;
        match rustix::fs::fstat(&fd) {
            Ok(st) if (st.st_dev, st.st_ino) == key => Some((fd, path)),
            _ => None,
        }
    }

    /// The lease on descriptor `fd` is being broken: stop serving its file, then give it up.
    pub(super) fn lease_broken(&self, fd: i32) {
        let _turn = self.leases.turn();
        let record = self
            .leases
            .held()
            .iter()
            .find(|(_, held)| held.as_raw_fd() == fd)
            .map(|(&record, _)| record);
        if let Some(record) = record {
            self.stop_serving(record);
        }
    }

    /// `SIGIO` came instead of a break's own signal: every lease being broken is.
    pub(super) fn leases_lost(&self) {
        let _turn = self.leases.turn();
        let broken: Vec<usize> = self
            .leases
            .held()
            .iter()
            .filter(|(_, fd)| lease::is_broken(fd.as_fd()))
            .map(|(&record, _)| record)
            .collect();
        for record in broken {
            self.stop_serving(record);
        }
    }

    /// A client is about to have `record`'s file opened for writing: ends the owner's lease
    /// first (the owner's own open would break it and wait on itself).
    pub(super) fn end_lease(&self, record: usize) {
        let _turn = self.leases.turn();
        if self.leases.holds(record) {
            self.stop_serving(record);
        }
    }

    /// A client holds `record`'s file writable: no lease can be had, so the file is served
    /// and watched (dropping what was cached while it passed through).
    pub(super) fn serve_watched(&self, record: usize) {
        let _turn = self.leases.turn();
        let rec = &self.map.files()[record];
        // From the mark on every open waits for the owner (`held.rs`).
        let held = self.mark_held(record);
        rec.signal
            .store(if held { HELD } else { WATCH }, Ordering::Release);
        if rec.serving.load(Ordering::Acquire) & 1 == 1
            && !self.leases.holds(record)
            && !self.held_open_outside(record)
        {
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
    }

    /// `record`'s file leaves the cache: its lease (if any) is given up, nothing else done.
    pub(super) fn forget_lease(&self, record: usize) {
        let _turn = self.leases.turn();
        if let Some(fd) = self.leases.held().remove(&record) {
            let _ = lease::release(fd.as_fd());
        }
        let rec = &self.map.files()[record];
        if rec.serving.load(Ordering::Acquire) & 1 == 1 {
            rec.serving.fetch_add(1, Ordering::AcqRel);
        }
        rec.signal.store(WATCH, Ordering::Release);
    }

    /// The files that pass through (their lease is tried again every tick).
    pub(super) fn passing_through(&self) -> Vec<usize> {
        let files: Vec<usize> = self
            .files
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .copied()
            .collect();
        files
            .into_iter()
            .filter(|&r| self.map.files()[r].serving.load(Ordering::Acquire) & 1 == 1)
            .collect()
    }

    /// Stops serving `record`'s file and gives its lease up. Under `turn`.
    fn stop_serving(&self, record: usize) {
        let Some(fd) = self.leases.held().remove(&record) else {
            return;
        };
        self.leases.breaks.fetch_add(1, Ordering::Relaxed);
        let rec = &self.map.files()[record];
        let file = self.served_file(record);
        // Storage first gets every byte the cache holds newer than it: clients that pass
        // through read storage, and so may the opener once the lease is gone. (Passing
        // through before the write back would let a client read bytes older than ones the
        // cache had acknowledged: the preload library's `serving` explains the order.)
        if let Some(file) = &file
            && let Err(e) = file.sync_all()
        {
            log(
                &self.name,
                &format!("outside writers: writing record {record} back for a writer: {e}"),
            );
        }
        if rec.serving.load(Ordering::Acquire) & 1 == 0 {
            rec.serving.fetch_add(1, Ordering::SeqCst);
        }
        rec.signal.store(WATCH, Ordering::Release);
        if let Some(file) = &file
            && let Err(e) = file.changed_outside()
        {
            log(
                &self.name,
                &format!("outside writers: record {record}: {e}"),
            );
        }
        if let Err(e) = lease::release(fd.as_fd()) {
            log(
                &self.name,
                &format!("outside writers: releasing a lease: {e}"),
            );
        }
    }
}

/// The lease thread: waits for breaks and handles each.
pub(super) fn run(owner: &Arc<Owner>) {
    loop {
        match lease::wait() {
            Ok(lease::Woken::Broken(fd)) => owner.lease_broken(fd),
            Ok(lease::Woken::Lost) => owner.leases_lost(),
            Err(e) => {
                log(
                    &owner.name,
                    &format!("outside writers: waiting for leases: {e}"),
                );
                return;
            }
        }
    }
}
