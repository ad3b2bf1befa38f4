//! How a file comes to be served from the cache, and stops: the descriptor the library lends
//! the cached file (its own read-only O_DIRECT open, or a duplicate of the program's one
//! writable description), the lease on it, the switch to passing through when the lease
//! breaks (the dirty data written back first), the retries after a back-off, and the last
//! close, where the descriptor is closed inside the program's own close (see the module doc
//! of `adapter`).

use super::{FIRST_BACKOFF, Inode, Io, LONGEST_BACKOFF, SERVABLE, debug, fcntl, lock};
use crate::lease::{self, Kind, Refused};
use crate::stats::{self, Reason};
use foliocache::{Error, File, OpenOptions};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

impl Inode {
    /// After the program opened the file as `fd`, its description counted: serve it if a
    /// lease can be had. Only for outer calls.
    pub(crate) fn opened(self: &Arc<Self>, fd: RawFd) {
        self.carry_out_pending();
        let mut io = lock(&self.io);
        if self.shared {
            if let Err(reason) = self.serve_shared(&mut io, fd) {
                debug(format_args!(
                    "{:?}: not served ({})",
                    self.key,
                    reason.as_str()
                ));
                if io.why != Some(reason) {
                    stats::passed_through(reason);
                }
                io.why = Some(reason);
            }
            return;
        }
        if self.serving.now() {
            // Still served: the program's open did not conflict with the lease (a read-only
            // open beside a read lease).
            let fits = match io.lease {
                Some(Kind::Read) => io.writers == 0,
                Some(Kind::Write) => io.writers + io.readers == 1,
                None => false,
            };
            if fits {
                return;
            }
            self.stop(&mut io, Reason::Busy);
        }
        io.retry_at = None;
        self.try_serve(&mut io, fd);
    }

    /// Tries to serve the file: the descriptor, the lease, the cached file. The program's
    /// `fd` is any fd of it (all its fds are of the one description when a write lease is
    /// wanted).
    fn try_serve(self: &Arc<Self>, io: &mut Io, fd: RawFd) {
        match self.serve(io, fd) {
            Ok(()) => {}
            Err(reason) => {
                debug(format_args!(
                    "{:?}: not served ({})",
                    self.key,
                    reason.as_str()
                ));
                // Without a lease another process may write the file from now on: what the
                // cache holds of it is dropped before it serves again.
                self.stale.store(true, Ordering::Release);
                if io.why != Some(reason) {
                    stats::passed_through(reason);
                }
                io.why = Some(reason);
                let retry = matches!(reason, Reason::Busy | Reason::Broken);
                io.retry_at = retry.then(|| Instant::now() + io.backoff);
            }
        }
    }

    fn serve(self: &Arc<Self>, io: &mut Io, fd: RawFd) -> Result<(), Reason> {
        if self.never.load(Ordering::Acquire) != SERVABLE {
            return Err(io.why.unwrap_or(Reason::UntrackedPath));
        }
        if io.shared {
            return Err(Reason::Inherited);
        }
        if !lease::signal_usable() {
            return Err(Reason::Signal);
        }
        let kind = if io.writers == 0 {
            Kind::Read
        } else if io.writers == 1 && io.readers == 0 {
            Kind::Write
        } else {
            return Err(Reason::Busy);
        };
        let program_flags = fcntl(fd, libc::F_GETFL, 0);
        if program_flags < 0 {
            return Err(Reason::Busy);
        }
        let write_only = program_flags & libc::O_ACCMODE == libc::O_WRONLY;
        if kind == Kind::Write && write_only && !self.is_back() {
            return Err(Reason::WriteOnly); // nothing to read, nothing to cache
        }
        // The descriptor: the one lent already if it suits the lease, else a new one.
        let fresh = match io.lent {
            Some(_) if io.own == (kind == Kind::Read) => None,
            // The other kind's descriptor stays open until the last close, and the kernel
            // counts it: no lease of this kind can be had meanwhile.
            Some(_) => return Err(Reason::Busy),
            // The cache refused a descriptor of this file before (kept open, see `lend`):
            // it would refuse again for the same reason.
            None if io.refused.is_some() => return Err(io.why.unwrap_or(Reason::Busy)),
            None => Some(self.new_descriptor(kind, fd)?),
        };
        let raw = fresh
            .as_ref()
            .map_or_else(|| io.lent.unwrap_or(-1), AsRawFd::as_raw_fd);
        if let Some(fresh) = &fresh {
            crate::own_fds::add(fresh.as_raw_fd());
        }
        // The lease first: from here on no other process can change the file unheard, so
        // what the cached file checks now stays true.
        let leased = lease::take(raw, kind, self);
        if let Some(fresh) = fresh
            && let Err(reason) = self.lend(io, fresh, kind == Kind::Write)
        {
            if leased.is_ok() {
                lease::release(raw);
            }
            return Err(reason);
        }
        match leased {
            Ok(()) => {}
            Err(Refused::Busy) => return Err(Reason::Busy),
            Err(Refused::Broken) => return Err(Reason::Broken),
            Err(Refused::Unsupported) => return Err(Reason::NoLease),
            Err(Refused::NoSignal) => return Err(Reason::Signal),
        }
        io.lease = Some(kind);
        debug(format_args!("{:?}: {kind:?} lease taken", self.key));
        io.leased_at = Some(Instant::now());
        stats::lease_taken();
        let file = self.file.get().expect("lent a descriptor");
        if self.stale.swap(false, Ordering::AcqRel) {
            // Pages that came in while the file passed through may be older than storage.
            let _ = file.changed_outside();
        }
        io.why = None;
        io.retry_at = None;
        // Served: the lease is held and the cache is exact.
        self.serving.start();
        Ok(())
    }

    /// On a shared cache: serves the file, through a descriptor of the library's own that
    /// allows writing once the program has a writable description (a read-only one lent
    /// before is then parked until the last close: closing it would drop the program's
    /// locks).
    fn serve_shared(self: &Arc<Self>, io: &mut Io, fd: RawFd) -> Result<(), Reason> {
        if self.never.load(Ordering::Acquire) != SERVABLE {
            return Err(io.why.unwrap_or(Reason::UntrackedPath));
        }
        if io.shared {
            return Err(Reason::Inherited);
        }
        let write = io.writers > 0;
        let fits = io.lent.is_some() && (!write || self.file.get().is_some_and(File::is_writable));
        if !fits {
            let fresh = self.new_descriptor(if write { Kind::Write } else { Kind::Read }, fd)?;
            crate::own_fds::add(fresh.as_raw_fd());
            if io.lent.is_some()
                && let Some(file) = self.file.get()
            {
                match file.detach_descriptor() {
                    Ok(old) => {
                        io.parked.push(old);
                        io.lent = None;
                    }
                    Err(_) => {
                        crate::own_fds::remove(fresh.as_raw_fd());
                        return Err(Reason::Busy);
                    }
                }
            }
            self.lend(io, fresh, write)?;
        }
        if self.stale.swap(false, Ordering::AcqRel)
            && let Some(file) = self.file.get()
        {
            // This process wrote through the kernel while it passed through.
            let _ = file.changed_outside();
        }
        io.why = None;
        self.serving.start();
        Ok(())
    }

    /// A descriptor for a lease of `kind`: the library's own read-only open (O_DIRECT for a
    /// private cache), or a duplicate of the program's (single, writable) description.
    fn new_descriptor(&self, kind: Kind, fd: RawFd) -> Result<OwnedFd, Reason> {
        let raw = match kind {
            Kind::Read => {
                let path = format!("/proc/self/fd/{fd}\0");
                let direct = if self.shared { 0 } else { libc::O_DIRECT };
                // SAFETY: a NUL-terminated path; the real open (the library's own descriptor
                // is not the program's, and is not in the table).
                let raw = unsafe {
                    crate::real::open(
                        path.as_ptr().cast(),
                        libc::O_RDONLY | direct | libc::O_CLOEXEC,
                        0,
                    )
                };
                if raw < 0 {
                    let errno = std::io::Error::last_os_error().raw_os_error();
                    return Err(if errno == Some(libc::EINVAL) {
                        Reason::NoDirectIo
                    } else {
                        Reason::NoLease
                    });
                }
                raw
            }
            Kind::Write => {
                let raw = fcntl(fd, libc::F_DUPFD_CLOEXEC, 0);
                if raw < 0 {
                    return Err(Reason::NoLease);
                }
                raw
            }
        };
        // SAFETY: a descriptor just opened or duplicated here, owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(raw) })
    }

    /// Lends `fd` to the cached file (made now at the first time). A descriptor it refuses is
    /// kept in `refused` until the last close: closing it now would drop the program's locks.
    fn lend(&self, io: &mut Io, fd: OwnedFd, write: bool) -> Result<(), Reason> {
        let raw = fd.as_raw_fd();
        let write = write && self.is_back();
        let outcome = match self.file.get() {
            Some(file) => file
                .attach_descriptor(fd, write)
                .map(|r| {
                    if r.changed {
                        debug(format_args!("{:?}: changed since the last close", self.key));
                    }
                })
                .map_err(|refused| (refused.error, refused.fd)),
            None => {
                let options = OpenOptions::new().write(write);
                match self.cache.open_descriptor(fd, options) {
                    Ok(file) => {
                        *lock(&self.flusher) = Some(file.handle());
                        let _ = self.file.set(file);
                        stats::opened_file();
                        Ok(())
                    }
                    Err(refused) => Err((refused.error, refused.fd)),
                }
            }
        };
        match outcome {
            Ok(()) => {
                io.lent = Some(raw);
                io.own = !write && fcntl(raw, libc::F_GETFL, 0) & libc::O_DIRECT != 0;
                Ok(())
            }
            Err((error, fd)) => {
                debug(format_args!(
                    "{:?}: the cache refused it: {error}",
                    self.key
                ));
                io.refused = Some(fd);
                Err(refusal_reason(&error))
            }
        }
    }

    /// Stops serving: in write-back mode the dirty data goes to storage first (and, if it
    /// cannot, is dropped as the kernel drops data a writeback failed for: another process is
    /// about to see storage), then the lease is released. Called with the `io` lock.
    pub(super) fn stop(&self, io: &mut Io, reason: Reason) {
        if self.serving.now() {
            {
                // Writes wait at the gate; reads go on from the cache, which is exact while the
                // lease holds, until the kernel has every byte (see `serving`).
                let _gate = self
                    .is_back()
                    .then(|| self.gate.write().unwrap_or_else(PoisonError::into_inner));
                self.serving.stop_after(|| {
                    self.write_back_all();
                    // On a shared cache the dirty data is the cache's, other processes' too:
                    // it stays (a failed write back is retried by the owner).
                    if let Some(file) = self.file.get()
                        && self.is_back()
                        && !self.shared
                    {
                        let lost = file.discard_dirty(libc::EIO);
                        if lost > 0 {
                            debug(format_args!("{:?}: {lost} dirty pages dropped", self.key));
                        }
                    }
                });
            }
            self.stale.store(true, Ordering::Release);
            if let Some(file) = self.file.get()
                && !self.shared
            {
                file.drop_cached(0, 0);
            }
        }
        if io.why != Some(reason) {
            stats::passed_through(reason);
            debug(format_args!(
                "{:?}: passes through ({})",
                self.key,
                reason.as_str()
            ));
        }
        io.why = Some(reason);
        if let (Some(_), Some(fd)) = (io.lease.take(), io.lent) {
            lease::release(fd);
        }
    }

    /// A file passing through: whether it is served again now (its back-off passed and a
    /// lease can be had). Takes no lock if another thread holds the inode's.
    pub(super) fn retry(self: &Arc<Self>, fd: RawFd) -> bool {
        if self.never.load(Ordering::Acquire) != SERVABLE {
            return false;
        }
        let Ok(mut io) = self.io.try_lock() else {
            return false;
        };
        let Some(at) = io.retry_at else { return false };
        if Instant::now() < at {
            return false;
        }
        io.retry_at = None;
        if io.lease.is_some() {
            // A nested write marked the cache stale under a lease that still stands.
            if let Some(file) = self.file.get() {
                let _ = file.changed_outside();
            }
            self.stale.store(false, Ordering::Release);
            self.serving.start();
            io.why = None;
            return true;
        }
        self.try_serve(&mut io, fd);
        self.serving.now()
    }

    /// The program's last fd of the file is about to close (outer call, before the real
    /// close): what is dirty goes to storage, the lease is released, and the library's
    /// descriptor is closed, now, where the program's close drops its locks anyway. The
    /// cached file keeps its pages for the next open.
    pub(crate) fn last_close(&self) {
        let mut io = lock(&self.io);
        debug(format_args!("{:?}: last close", self.key));
        if self.fds() != 0 {
            return; // reopened meanwhile
        }
        if self.serving.now() && self.is_back() && !self.shared {
            self.write_back_all();
        }
        let was_serving = self.serving.now();
        self.serving.stop_now(); // no fd is left to read through
        let lease = io.lease.take();
        if let Some(file) = self.file.get() {
            if self.stale.swap(false, Ordering::AcqRel)
                || self.never.load(Ordering::Acquire) != SERVABLE
            {
                let _ = file.changed_outside();
            }
            if io.lent.is_some() {
                // The stamp the next attach compares with is taken here, while the lease
                // (if any) still stands: nobody can have changed the file since the cache
                // last knew it.
                match file.detach_descriptor() {
                    Ok(fd) => {
                        if lease.is_some() {
                            lease::release(fd.as_raw_fd());
                        }
                        io.lent = None;
                        crate::own_fds::remove(fd.as_raw_fd());
                        drop(fd);
                    }
                    Err(Error::StillDirty { .. }) => {
                        // The write back failed: everything stays (the flusher tries again),
                        // the descriptor and the lease with it; a later last close ends them.
                        io.lease = lease;
                        if was_serving {
                            self.serving.start();
                        }
                        return;
                    }
                    Err(_) => {}
                }
            }
        }
        if let (Some(_), Some(fd)) = (lease, io.lent) {
            lease::release(fd);
        }
        if let Some(fd) = io.refused.take() {
            crate::own_fds::remove(fd.as_raw_fd());
            drop(fd);
        }
        for fd in io.parked.drain(..) {
            crate::own_fds::remove(fd.as_raw_fd());
            drop(fd);
        }
        io.own = false;
        io.shared = false;
        io.why = None;
        io.retry_at = None;
        io.backoff = FIRST_BACKOFF;
    }

    /// A writable description of this file went to another process (fork, a spawned
    /// program): the file passes through until its last fd closes.
    pub(crate) fn shared_with_another_process(&self) {
        let mut io = lock(&self.io);
        io.shared = true;
        self.stop(&mut io, Reason::Inherited);
        io.retry_at = None;
    }

    /// Whether the program has a writable description of the file.
    pub(crate) fn has_writer(&self) -> bool {
        lock(&self.io).writers > 0
    }

    /// Before an `exec`: the lease goes (the new program would inherit it on a description
    /// it does not know). Returns the library's descriptors of the file, for the caller to
    /// keep across the exec where the program's are kept.
    pub(crate) fn before_exec(&self) -> Vec<RawFd> {
        let mut io = lock(&self.io);
        self.stop(&mut io, Reason::Exec);
        io.retry_at = None;
        io.lent
            .into_iter()
            .chain(io.refused.as_ref().map(AsRawFd::as_raw_fd))
            .chain(io.parked.iter().map(AsRawFd::as_raw_fd))
            .collect()
    }
}

impl lease::Holder for Inode {
    /// The lease on `fd` was broken (on the lease thread).
    fn lease_broken(&self, fd: RawFd) {
        let mut io = lock(&self.io);
        let Some(kind) = io.lease else { return };
        if io.lent != Some(fd) || lease::stands(fd, kind) {
            return; // a signal for a lease given up since, or queued twice
        }
        stats::lease_broken();
        // The back-off doubles while leases break soon after they were taken.
        let lasted = io.leased_at.map_or(Duration::ZERO, |at| at.elapsed());
        io.backoff = if lasted > LONGEST_BACKOFF {
            FIRST_BACKOFF
        } else {
            (io.backoff * 2).min(LONGEST_BACKOFF)
        };
        self.stop(&mut io, Reason::Broken);
        io.retry_at = Some(Instant::now() + io.backoff);
    }
}

/// Why a file passes through when the cache refused its descriptor.
fn refusal_reason(error: &Error) -> Reason {
    match error {
        Error::NoDirectIo { .. } => Reason::NoDirectIo,
        Error::OpenConflict { .. } => Reason::Busy,
        Error::Engine(_) => Reason::IoEngine,
        _ => Reason::NoLease,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_that_cannot_start_is_its_own_reason() {
        let refused = std::io::Error::from_raw_os_error(libc::EPERM);
        assert_eq!(
            refusal_reason(&Error::Engine(refused)).as_str(),
            "io-engine"
        );
        let other = Error::ReadOnly;
        assert_eq!(refusal_reason(&other).as_str(), "no-lease");
    }
}
