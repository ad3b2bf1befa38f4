//! The control socket: one thread per client connection. A connection says hello (the client
//! gets a process slot and the mapping), opens and closes files, claims and releases thread
//! slots, and asks for the rare operations (statistics, status, drop, sync, destroy). When it
//! closes (the client detached, or died: the kernel closes a dead process's sockets) or its
//! process is found dead, everything the process held is freed (`Owner::detach`).
//!
//! What a client's death leaves, and what frees it:
//! * its thread slots: each slot's server thread is stopped after the request it runs (a
//!   request runs to its end; writes acknowledged or not are the cache's, as with `write(2)`
//!   the kernel completed), its staging folio freed, its pin cleared (a dead reader's pin would
//!   hold every grace period back), its claim cleared;
//! * its process slot, and its line in `NAME.clients`;
//! * its opens: files stay cached (the cache's, not the process's).
//!
//! Clients hold no folio reference and no lock of the owner's: the hit path reads optimistically
//! (`mem::optimistic`), so a client killed at any instruction leaves no count behind.

use super::{Owner, Served, log, serve};
use crate::error::Error;
use crate::mem::epoch;
use crate::mem::shared::ProcessSlot;
use crate::shared::mailbox::{CLAIMED, FREE};
use crate::shared::runtime;
use crate::shared::wire::{self, Conn, Msg, file_op, kind};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Instant;

/// An error answer: errno (0 when there is none) and the error's text.
fn refuse(error: &Error) -> Msg {
    let errno = match error {
        Error::Open { source, .. } | Error::Io { source, .. } => source.raw_os_error().unwrap_or(0),
        _ => 0,
    };
    Msg::with_text(kind::ERROR, &[errno.max(0) as u64], error.to_string())
}

/// Clears what a process slot says of its process (its state is the caller's).
fn forget_process(slot: &ProcessSlot) {
    slot.pid.store(0, Ordering::Relaxed);
    slot.start.store(0, Ordering::Relaxed);
    slot.memfd.store(u32::MAX, Ordering::Relaxed);
}

fn bad(text: &str) -> Msg {
    Msg::with_text(kind::ERROR, &[libc::EINVAL as u64], text)
}

impl Owner {
    /// Serves one connection until it closes, then frees what its process held.
    pub(super) fn serve_connection(self: Arc<Self>, conn: Conn) {
        let peer = match conn.peer() {
            Ok((uid, pid)) if uid == rustix::process::geteuid().as_raw() => pid,
            Ok((uid, pid)) => {
                log(
                    &self.name,
                    &format!("refused process {pid} of user {uid}: not this cache's user"),
                );
                let _ = conn.send(&bad("this cache belongs to another user"), None);
                return;
            }
            Err(e) => {
                log(&self.name, &format!("refused a connection: {e}"));
                return;
            }
        };
        let mut process: Option<u32> = None;
        // Who said hello on this connection: (pid, start time).
        let mut attached_as = (0u32, 0u64);
        loop {
            let (msg, fd) = match conn.recv() {
                Ok(Some(got)) => got,
                Ok(None) => break,
                Err(e) => {
                    log(&self.name, &format!("a connection failed: {e}"));
                    break;
                }
            };
            let answer = match (msg.kind, process) {
                (kind::HELLO, None) => match self.hello(&msg, peer) {
                    Ok(slot) => {
                        process = Some(slot);
                        let p = &self.map.processes()[slot as usize];
                        attached_as = (
                            p.pid.load(Ordering::Acquire),
                            p.start.load(Ordering::Acquire),
                        );
                        let welcome = Msg::new(kind::WELCOME, &[u64::from(slot)]);
                        if conn.send(&welcome, Some(self.map.fd().as_fd())).is_err() {
                            break;
                        }
                        continue;
                    }
                    Err(text) => bad(&text),
                },
                (kind::HELLO, Some(_)) => bad("hello twice"),
                (_, None) => self.admin(&msg),
                (_, Some(p)) => self.request(p, attached_as, &msg, fd),
            };
            if conn.send(&answer, None).is_err() {
                break;
            }
            if self.stopping.load(Ordering::Acquire) {
                break;
            }
        }
        if let Some(p) = process {
            // This connection's own attach only: the slot may have been freed already (its
            // pid found dead) and given to another process since.
            self.detach(p, attached_as.0, attached_as.1);
        }
    }

    /// A client's hello: `[protocol, pid, start time, memfd number, previous slot]`; gives it
    /// a process slot.
    ///
    /// After a takeover every process slot is free (`state` 0) but keeps its process's pid and
    /// start time, and the claim words of a live process's thread slots still name its old
    /// slot until that process comes back and stamps them again. So a process coming back
    /// (`previous`, checked against its pid and start time) gets its old slot, and no other
    /// process is given a slot whose process is still alive: given to another, a detach of
    /// that one would free the returning process's thread slots (their staging folios gone
    /// while its threads still use them), and a takeover would judge them by the wrong pid.
    ///
    /// The pid is the kernel's word for the peer (`SO_PEERCRED`, `peer`), not the one the
    /// message carries: a process cannot name another (and take the slot a live process of
    /// that pid comes back to), and the pid is the one this owner's `/proc` knows it by.
    fn hello(&self, msg: &Msg, peer: u32) -> Result<u32, String> {
        if msg.word(0).ok() != Some(wire::PROTOCOL) {
            return Err("the client speaks another protocol (another foliocache build)".into());
        }
        let said = msg.word(1).map_err(|e| e.to_string())? as u32;
        if said != peer {
            log(
                &self.name,
                &format!(
                    "process {peer} said hello as process {said} (another pid namespace?): \
                     known as {peer}"
                ),
            );
        }
        let pid = peer;
        let start = msg.word(2).map_err(|e| e.to_string())?;
        let memfd = msg.word(3).unwrap_or(u64::MAX);
        let previous = msg.word(4).unwrap_or(u64::MAX);
        // Attaches and detaches of process slots one at a time (see `detach`).
        let _attaching = self
            .attach_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let slots = self.map.processes();
        let take = |p: &ProcessSlot| {
            p.state
                .compare_exchange(0, 2, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        };
        let own = usize::try_from(previous).ok().filter(|&i| {
            slots.get(i).is_some_and(|p| {
                p.pid.load(Ordering::Acquire) == pid
                    && p.start.load(Ordering::Acquire) == start
                    && take(p)
            })
        });
        let slot = own
            .or_else(|| {
                slots.iter().position(|p| {
                    p.state.load(Ordering::Acquire) == 0
                        && !runtime::alive(
                            p.pid.load(Ordering::Acquire),
                            p.start.load(Ordering::Acquire),
                        )
                        && take(p)
                })
            })
            .ok_or_else(|| format!("all {} process slots are in use", slots.len()))?;
        let p = &slots[slot];
        p.pid.store(pid, Ordering::Relaxed);
        p.start.store(start, Ordering::Relaxed);
        p.memfd
            .store(u32::try_from(memfd).unwrap_or(u32::MAX), Ordering::Relaxed);
        p.state.store(1, Ordering::Release);
        self.clients.fetch_add(1, Ordering::AcqRel);
        *self
            .idle_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        self.write_clients_file();
        drop(_attaching);
        // Files it opened before it attached were held for it as for an outside opener.
        self.held_attached(pid);
        Ok(slot as u32)
    }

    /// Frees what process slot `p` held while process `pid` (started at `start`) was attached
    /// there: its connection closed, or its process was found dead. Both happen for one death,
    /// in either order, and the slot can be given to a new process in between: so a detach
    /// names the attach it ends, and does nothing to another one (attaches and detaches hold
    /// `attach_lock`, so the check and the change are one step).
    pub(super) fn detach(&self, p: u32, pid: u32, start: u64) {
        let Some(slot) = self.map.processes().get(p as usize) else {
            return;
        };
        {
            let _detaching = self
                .attach_lock
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if slot.pid.load(Ordering::Acquire) != pid
                || slot.start.load(Ordering::Acquire) != start
                || slot
                    .state
                    .compare_exchange(1, 3, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err()
            {
                return;
            }
            self.free_thread_slots_of(p);
            // Its opens go with it (its files may be retired once idle).
            for served in self
                .files
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .values_mut()
            {
                served.opens.remove(&p);
            }
            forget_process(slot);
            slot.state.store(0, Ordering::Release);
        }
        self.write_clients_file();
        if self.clients.fetch_sub(1, Ordering::AcqRel) == 1 {
            // The last process left: its dirty data is written back now, not at the idle
            // timeout (an owner killed meanwhile would otherwise lose it).
            if let Err(e) = self.sync_all() {
                log(
                    &self.name,
                    &format!("writing back after the last detach: {e}"),
                );
            }
            *self
                .idle_since
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(std::time::Instant::now());
        }
        // A grace period may have waited on the dead pins.
        epoch::collect();
    }

    /// Frees every thread slot process slot `p` holds; how many.
    fn free_thread_slots_of(&self, p: u32) -> usize {
        let claim = CLAIMED | p;
        (0..self.map.threads().len() as u32)
            .filter(|&i| {
                // A look before the slot's lock, which `free_thread_slot` takes to check again.
                self.map.threads()[i as usize].claim.load(Ordering::Acquire) == claim
                    && self.free_thread_slot(i, claim)
            })
            .count()
    }

    /// Stops a thread slot's server, frees its staging folio and clears the slot, if its claim
    /// word is still `claim`: checked under the slot's lock (`slot_locks`), so after a claim of
    /// it in progress has finished, since a check made before the lock may be stale (the slot
    /// freed and claimed by another process meanwhile). Whether it freed the slot.
    fn free_thread_slot(&self, slot: u32, claim: u32) -> bool {
        let _slot = self.slot_locks[slot as usize]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let t = &self.map.threads()[slot as usize];
        if t.claim.load(Ordering::Acquire) != claim {
            return false;
        }
        // The staging folio the owner gave (its server's): the slot's word in the mapping is
        // the client's to read, and names nothing this owner gave if the claim never got that
        // far (a fresh mapping's slot said folio 0, and a free then freed page 0, another
        // slot's staging folio, under that slot's client: the likely cause of a kill storm's
        // read that returned another page's bytes).
        if let Some(staging) = self.stop_server(slot) {
            self.free_staging(staging);
        }
        t.staging.store(u32::MAX, Ordering::Release);
        t.pin.store(0, Ordering::Release);
        t.state.store(FREE, Ordering::Release);
        t.claim.store(0, Ordering::Release);
        true
    }

    /// Processes whose pid died while their connection stayed open (a child forked without
    /// exec holds it): detached as if it had closed. And processes a takeover found attached
    /// that died before they came back to this owner (their process slot free, its pid kept:
    /// `hello`): the thread slots the takeover kept for them are freed.
    pub(super) fn reap_dead(&self) {
        for (i, p) in self.map.processes().iter().enumerate() {
            let state = p.state.load(Ordering::Acquire);
            let pid = p.pid.load(Ordering::Acquire);
            if state == 1 || (state == 0 && pid != 0) {
                let start = p.start.load(Ordering::Acquire);
                if !runtime::alive(pid, start) {
                    if state == 1 {
                        log(&self.name, &format!("process {pid} died attached"));
                        self.detach(i as u32, pid, start);
                    } else {
                        self.forget_left(i as u32, pid, start);
                    }
                }
            }
        }
    }

    /// Process slot `p`, left by a takeover for process `pid` (started at `start`), which died
    /// before it came back: its thread slots are freed and the slot forgotten (under
    /// `attach_lock`, checked again: a hello may have given the slot out since).
    fn forget_left(&self, p: u32, pid: u32, start: u64) {
        let Some(slot) = self.map.processes().get(p as usize) else {
            return;
        };
        let _attaching = self
            .attach_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if slot.state.load(Ordering::Acquire) != 0
            || slot.pid.load(Ordering::Acquire) != pid
            || slot.start.load(Ordering::Acquire) != start
        {
            return;
        }
        let freed = self.free_thread_slots_of(p);
        forget_process(slot);
        log(
            &self.name,
            &format!(
                "process {pid} died before it came back after the takeover: {freed} thread \
                 slots freed"
            ),
        );
    }

    /// A request from process slot `p`, where this connection's process (`who`: pid, start
    /// time) attached.
    fn request(self: &Arc<Self>, p: u32, who: (u32, u64), msg: &Msg, fd: Option<OwnedFd>) -> Msg {
        match msg.kind {
            kind::OPEN => match fd {
                Some(fd) => self.open(p, msg, &fd).unwrap_or_else(|e| refuse(&e)),
                None => bad("an open without its descriptor"),
            },
            kind::CLOSE => {
                let record = msg.word(0).unwrap_or(u64::MAX) as usize;
                let generation = msg.word(1).unwrap_or(0) as u32;
                let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(served) = files.get_mut(&record)
                    && served.generation == generation
                    && let Some(n) = served.opens.get_mut(&p)
                {
                    *n = n.saturating_sub(1);
                    served.used = Instant::now();
                }
                Msg::new(kind::OK, &[])
            }
            kind::CLAIM => self.claim(p, msg.word(0).unwrap_or(u64::MAX)),
            kind::RELEASE => self.release(p, who, msg.word(0).unwrap_or(u64::MAX)),
            kind::FILE_OP => self.file_op(msg).unwrap_or_else(|e| refuse(&e)),
            kind::MEMFD => {
                let fd = msg.word(0).ok().and_then(|fd| u32::try_from(fd).ok());
                if let (Some(fd), Some(slot)) = (fd, self.map.processes().get(p as usize)) {
                    slot.memfd.store(fd, Ordering::Release);
                    self.write_clients_file();
                }
                Msg::new(kind::OK, &[])
            }
            _ => self.admin(msg),
        }
    }

    /// Thread slot `slot` given back by process slot `p`'s process `who` (pid, start time): freed
    /// only while `who` is still attached there, checked and freed under `attach_lock`. A
    /// connection reads what a process sent before it died after the process is gone: if its
    /// death was seen first (the owner's tick), the process slot may have gone to another
    /// process meanwhile, whose thread slots carry the same claim word, and the dead one's
    /// release freed the newcomer's slot under it (its staging folio and server gone while it
    /// used them; `a_dead_process_release_read_late_frees_nothing_of_its_successor`).
    fn release(&self, p: u32, who: (u32, u64), slot: u64) -> Msg {
        crate::inject::kill::point("release");
        let _attached = self
            .attach_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let still = self.map.processes().get(p as usize).is_some_and(|s| {
            s.state.load(Ordering::Acquire) == 1
                && s.pid.load(Ordering::Acquire) == who.0
                && s.start.load(Ordering::Acquire) == who.1
        });
        if !still {
            log(
                &self.name,
                &format!(
                    "a release of thread slot {slot} came from process {}, no longer attached: \
                     ignored",
                    who.0
                ),
            );
        } else if self.map.threads().get(slot as usize).is_some()
            && self.free_thread_slot(slot as u32, CLAIMED | p)
        {
            return Msg::new(kind::OK, &[]);
        }
        bad("a release of a slot this process does not hold")
    }

    /// A thread slot claimed by process `p`: a staging folio (kept if a previous owner left
    /// one), and a server thread.
    fn claim(self: &Arc<Self>, p: u32, slot: u64) -> Msg {
        let Some(t) = self.map.threads().get(slot as usize) else {
            return bad("no such thread slot");
        };
        // The check holds until the claim is done: a free of the slot (the process found
        // dead meanwhile) waits for it, and then frees what it gave. Without the lock, a free
        // could come between the check and the rest, and this claim would then give the slot,
        // claimed since by another process, a second staging folio and server.
        let _slot = self.slot_locks[slot as usize]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if t.claim.load(Ordering::Acquire) != CLAIMED | p {
            return bad("a claim of a slot this process did not take");
        }
        let Some(local) = self.cache.local() else {
            return bad("the owner runs no cache");
        };
        // A slot with a server has its staging folio (a claim made again, or one a takeover
        // kept): the server owns it.
        let served = self
            .servers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(slot as u32))
            .map(|server| server.staging);
        if let Some(staging) = served {
            // Said again, in case the client's words were changed.
            t.staging_order
                .store(u32::from(staging.order), Ordering::Relaxed);
            t.staging.store(staging.pfn, Ordering::Release);
        } else {
            crate::inject::kill::point("claim");
            let staging = match local.alloc_staging(self.staging_order) {
                Ok((pfn, order)) => serve::Staging { pfn, order },
                Err(e) => return refuse(&e),
            };
            t.staging_order
                .store(u32::from(staging.order), Ordering::Relaxed);
            t.staging.store(staging.pfn, Ordering::Release);
            self.start_server(slot as u32, staging);
        }
        Msg::new(kind::OK, &[])
    }

    /// An open: `[write, max order + 1 or 0, 0]` with the client's descriptor. The owner opens
    /// the same file (found through the descriptor, checked to be the same inode), and answers
    /// `[record, generation, max order]`.
    fn open(&self, p: u32, msg: &Msg, fd: &OwnedFd) -> Result<Msg, Error> {
        use std::os::unix::fs::MetadataExt;
        let write = msg.word(0).unwrap_or(0) != 0;
        let want = msg.word(1).unwrap_or(0);
        let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let meta = std::fs::metadata(&proc_path).map_err(|source| Error::Open {
            path: proc_path.clone().into(),
            source,
        })?;
        if !meta.is_file() {
            return Err(Error::Open {
                path: proc_path.into(),
                source: std::io::Error::other("a shared cache serves regular files only"),
            });
        }
        let path = std::fs::read_link(&proc_path).map_err(|source| Error::Open {
            path: proc_path.clone().into(),
            source,
        })?;
        let key = (meta.dev(), meta.ino());
        let existing = {
            let files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
            self.cache
                .local()
                .and_then(|l| l.records())
                .and_then(|r| r.find(key))
                .and_then(|record| files.get(&record).map(|s| s.file.max_order()))
        };
        let max_order = match (want, existing) {
            (0, Some(order)) => order,
            (0, None) => self.max_order,
            (w, _) => (w - 1).min(9) as u8,
        };
        if write
            && let Some(record) = self
                .cache
                .local()
                .and_then(|l| l.records())
                .and_then(|r| r.find(key))
        {
            self.end_lease(record);
        }
        let (file, record, generation) = self.open_path(&path, key, write, max_order)?;
        let order = file.max_order();
        self.serve_opened(p, record, generation, file, write);
        if write {
            self.serve_watched(record);
        } else {
            self.try_lease(record);
        }
        Ok(Msg::new(
            kind::OPENED,
            &[record as u64, u64::from(generation), u64::from(order)],
        ))
    }

    /// Counts a client's open of `record`'s file in the owner's table.
    fn serve_opened(&self, p: u32, record: usize, generation: u32, file: File, write: bool) {
        let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        let served = files
            .entry(record)
            .or_insert_with(|| Served::new(file.clone(), generation));
        if served.generation != generation {
            *served = Served::new(file, generation);
        } else if write {
            served.file = file;
        }
        *served.opens.entry(p).or_default() += 1;
        served.used = Instant::now();
    }

    /// A file operation through the control socket: `[record, generation, op, a, b]`.
    fn file_op(&self, msg: &Msg) -> Result<Msg, Error> {
        use crate::file::answer;
        let record = msg.word(0).unwrap_or(u64::MAX) as usize;
        let generation = msg.word(1).unwrap_or(0) as u32;
        let op = msg.word(2).unwrap_or(0);
        let a = msg.word(3).unwrap_or(0);
        let b = msg.word(4).unwrap_or(0);
        let file = self.file(record, generation)?;
        let words = match op {
            file_op::RA_STATS => answer::ra_stats(&file.readahead_stats()),
            file_op::IO_STATS => answer::io_stats(&file.io_stats()),
            file_op::WAIT_IO => {
                file.wait_for_io();
                Vec::new()
            }
            file_op::CACHED_RANGES => answer::ranges(&file.cached_ranges()),
            file_op::DROP_CACHED => answer::drop_report(&file.drop_cached(a, b)),
            file_op::REVALIDATE => answer::revalidated(&file.revalidate()?),
            file_op::MAPPING_STATS => answer::mapping_stats(&file.mapping_stats()),
            file_op::WRITTEN_OUTSIDE => {
                file.written_outside(a, b);
                Vec::new()
            }
            file_op::CHANGED_OUTSIDE => answer::revalidated(&file.changed_outside()?),
            file_op::DISCARD_DIRTY => vec![file.discard_dirty(a as i32)],
            _ => return Ok(bad("an unknown file operation")),
        };
        Ok(Msg::new(kind::OK, &words))
    }

    /// The operations any connection may ask, attached or not (`fcache cache ...`).
    fn admin(&self, msg: &Msg) -> Msg {
        match msg.kind {
            kind::STATS => Msg::new(
                kind::OK,
                &crate::cache::stats_words(&self.cache.stats(), &self.cache.reclaim_stats()),
            ),
            kind::STATUS => Msg::with_text(kind::OK, &[], self.status_json()),
            kind::DROP => {
                let files: Vec<_> = self
                    .files
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .values()
                    .map(|s| s.file.clone())
                    .collect();
                let mut dropped = 0;
                let mut kept = 0;
                for file in files {
                    let report = file.drop_cached(0, u64::MAX);
                    dropped += report.dropped_pages;
                    kept += report.busy_pages;
                }
                // The dropped pages are free once no reader can still see them: a status
                // after the drop counts them free.
                if let Some(local) = self.cache.local() {
                    local.memory().drain_caches();
                }
                Msg::new(kind::OK, &[dropped, kept])
            }
            kind::SYNC => match self.sync_all() {
                Ok(()) => Msg::new(kind::OK, &[]),
                Err(e) => refuse(&e),
            },
            kind::DESTROY => {
                let force = msg.word(0).unwrap_or(0) != 0;
                // A process that just let go may not have been seen leaving yet.
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
                while !force
                    && self.clients.load(Ordering::Acquire) > 0
                    && std::time::Instant::now() < deadline
                {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                let attached = self.clients.load(Ordering::Acquire);
                if attached > 0 && !force {
                    return Msg::with_text(
                        kind::ERROR,
                        &[libc::EBUSY as u64],
                        format!(
                            "{attached} processes are attached (destroy --force detaches them)"
                        ),
                    );
                }
                match self.sync_all() {
                    Ok(()) => {
                        self.stopping.store(true, Ordering::Release);
                        Msg::new(kind::OK, &[])
                    }
                    Err(e) => refuse(&e),
                }
            }
            kind::EVICT => Msg::new(kind::OK, &[self.cache.evict(msg.word(0).unwrap_or(0))]),
            _ => bad("an unknown request"),
        }
    }

    /// `fcache cache status`: the cache as JSON.
    fn status_json(&self) -> String {
        let stats = self.cache.stats();
        let live = self.map.live();
        let mut out = String::from("{");
        out.push_str(&format!(
            "\"name\":{:?},\"owner_pid\":{},\"owner_generation\":{},\"mapping_bytes\":{},\
             \"page_size\":{},\"total_pages\":{},\"free_pages\":{},\"pending_free_pages\":{},\
             \"index_reserve_pages\":{},\"placed_unused_pages\":{},\"dirty_pages\":{},\
             \"writeback_pages\":{},\"shmem_huge_pages\":{:?},\"huge_page_bytes\":{},\
             \"outside_writers\":{:?},",
            self.name,
            std::process::id(),
            live.owner_generation.load(Ordering::Relaxed),
            self.map.fixed().total,
            crate::mem::PAGE_SIZE,
            stats.total_pages,
            stats.free_pages,
            stats.pending_free_pages,
            stats.index_reserve_pages,
            stats.placed_unused_pages,
            stats.dirty.dirty_pages,
            stats.dirty.writeback_pages,
            super::shmem_huge_pages(),
            self.map.huge_bytes(),
            match (&self.outside, &self.held) {
                (Some(_), Some(_)) =>
                    "a read lease on each file no process holds writable (exact: an outside \
                            open for writing waits until the cache stops serving the file); \
                            on a file clients hold writable, fanotify permission events (exact: \
                            any outside open waits until the cache stops serving the file, which \
                            it serves again after the last outside close); inotify only for a \
                            file that had a writer outside when a client opened it for writing \
                            (a change by a program outside the cache drops the file's clean \
                            pages when its event arrives, after the write returned)",
                (Some(_), None) =>
                    "a read lease on each file no process holds writable (exact: an outside \
                            open for writing waits until the cache stops serving the file); \
                            otherwise inotify (no exact signal, no fanotify without \
                            CAP_SYS_ADMIN: a change by a program outside the cache drops the \
                            file's clean pages when its event arrives, after the write returned; \
                            writes through mmap raise no event and are seen at the next open)",
                (None, _) =>
                    "revalidation on open only (no inotify): a reader may see old bytes \
                         until the next open after an outside write",
            }
        ));
        out.push_str(&format!(
            "\"last_takeover_ns\":{},\"last_takeover_kept_pages\":{},",
            live.counters[5].load(Ordering::Relaxed),
            live.counters[super::takeover::KEPT].load(Ordering::Relaxed)
        ));
        out.push_str(&format!(
            "\"claims_file\":{:?},\"claims_refused\":{},",
            self.claims.describe(),
            self.claims.refused.load(Ordering::Relaxed)
        ));
        out.push_str(&format!(
            "\"leases_taken\":{},\"lease_breaks\":{},\"leases_refused\":{},",
            self.leases.taken.load(Ordering::Relaxed),
            self.leases.breaks.load(Ordering::Relaxed),
            self.leases.refused.load(Ordering::Relaxed)
        ));
        if let Some(h) = &self.held {
            out.push_str(&format!(
                "\"outside_opens_held\":{},\"outside_opens_waited_ns\":{},",
                h.opens_held.load(Ordering::Relaxed),
                h.waited_ns.load(Ordering::Relaxed)
            ));
        }
        if let Some(o) = &self.outside {
            out.push_str(&format!(
                "\"outside_events\":{},\"outside_changes\":{},\"outside_overflows\":{},",
                o.events.load(Ordering::Relaxed),
                o.changes.load(Ordering::Relaxed),
                o.overflows.load(Ordering::Relaxed)
            ));
        }
        let claimed = self
            .map
            .threads()
            .iter()
            .filter(|t| t.claim.load(Ordering::Acquire) & CLAIMED != 0)
            .count();
        out.push_str(&format!("\"claimed_thread_slots\":{claimed},"));
        out.push_str("\"processes\":[");
        let mut first = true;
        for p in self.map.processes() {
            if p.state.load(Ordering::Acquire) == 1 {
                if !first {
                    out.push(',');
                }
                first = false;
                out.push_str(&p.pid.load(Ordering::Relaxed).to_string());
            }
        }
        out.push_str("],\"files\":[");
        let files: Vec<(usize, File)> = self
            .files
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(&r, s)| (r, s.file.clone()))
            .collect();
        for (i, (record, file)) in files.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let path = self.map.files()[*record]
                .path()
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            let stats = file.mapping_stats();
            let rec = &self.map.files()[*record];
            let signal = if rec.serving.load(Ordering::Acquire) & 1 == 1 {
                "passing through"
            } else if rec.signal.load(Ordering::Acquire) == super::signal::LEASE {
                "lease"
            } else if rec.signal.load(Ordering::Acquire) == super::signal::HELD {
                "fanotify"
            } else {
                "inotify"
            };
            out.push_str(&format!(
                "{{\"path\":{:?},\"signal\":{signal:?},\"size\":{},\"cached_pages\":{},\
                 \"dirty_pages\":{},\"device_read_bytes\":{},\"ranges\":[",
                path,
                file.size(),
                stats.cached_pages,
                stats.dirty_pages,
                file.io_stats().bytes,
            ));
            for (j, range) in file.cached_ranges().iter().take(64).enumerate() {
                if j > 0 {
                    out.push(',');
                }
                out.push_str(&format!("[{},{}]", range.first, range.pages));
            }
            out.push_str("]}");
        }
        out.push_str("]}");
        out
    }
}

use crate::file::File;
