//! The io_uring engine: one ring per cache. Submitters push one `READV` or `WRITEV` per
//! transfer and submit a whole batch with one `io_uring_enter`; a completion thread (the
//! kernel's interrupt handler, in effect) reaps completions and ends the transfers.
//!
//! A transfer cut short (a device may move fewer bytes than asked, and a `readv` takes at most
//! [`MAX_IOVECS`](super::MAX_IOVECS) vectors) is continued by the completion thread with a new
//! entry from where it stopped (rounded down to the file's block size, as O_DIRECT requires),
//! never with a blocking call that would hold up every other completion. A panic while
//! completing a transfer is caught: that transfer's folios fail (their readers get an error)
//! and the thread goes on serving the others.
//!
//! The completion thread never blocks on the submission lock: a submitter holding it may be
//! waiting for the completion queue to drain, which is this thread's job. Continuations that
//! find the lock taken wait in a local list and are pushed on the next turn.

use super::{FileIo, Transfer, next_step, vectors_from};
use crate::inject::Inject;
use io_uring::{IoUring, opcode, squeue, types};
use std::os::fd::{AsRawFd, OwnedFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

/// Submission queue entries (the completion queue is twice as large).
const RING_ENTRIES: u32 = 256;
/// `user_data` of the no-op that wakes the completion thread for shutdown.
const WAKE: u64 = u64::MAX;

/// One transfer in flight: owns the transfer, its vectors and the file until it completes.
struct InFlight {
    transfer: Box<dyn Transfer>,
    /// Every vector of the transfer.
    all: Vec<libc::iovec>,
    /// The vectors of the entry in flight now (from `done` on, at most `MAX_IOVECS`), when
    /// they are not `all` as it is: `None` for a first entry that takes every vector (the
    /// common case, which then allocates nothing more).
    current: Option<Vec<libc::iovec>>,
    /// Bytes moved by earlier entries of this transfer.
    done: usize,
    fd: Arc<OwnedFd>,
    io: FileIo,
}

// SAFETY: the raw pointers in the vectors point into folio memory that the transfer keeps
// referenced (and locked, or stable under writeback) until it completes; `InFlight` moves
// between the submitter and the completion thread whole, and only one of them uses it at a
// time.
unsafe impl Send for InFlight {}

impl InFlight {
    /// The vectors of the entry in flight now.
    fn vectors(&self) -> &[libc::iovec] {
        self.current.as_deref().unwrap_or(&self.all)
    }

    /// Sets up the vectors of an entry from byte `done` of the transfer on.
    fn start_at(&mut self, done: usize) {
        self.done = done;
        self.current = if done == 0 && self.all.len() <= super::MAX_IOVECS {
            None
        } else {
            Some(vectors_from(&self.all, done))
        };
    }

    /// The ring entry for the vectors of the entry in flight.
    fn entry(&self) -> squeue::Entry {
        let fd = types::Fd(self.fd.as_raw_fd());
        let offset = self.transfer.offset() + self.done as u64;
        let vectors = self.vectors();
        let count = vectors.len() as u32;
        if self.transfer.is_write() {
            opcode::Writev::new(fd, vectors.as_ptr(), count)
                .offset(offset)
                .rw_flags(self.io.write_flags)
                .build()
        } else {
            opcode::Readv::new(fd, vectors.as_ptr(), count)
                .offset(offset)
                .rw_flags(self.io.read_flags)
                .build()
        }
    }
}

struct Shared {
    ring: IoUring,
    /// Serialises access to the submission queue (one producer at a time).
    submit_lock: Mutex<()>,
    in_flight: AtomicUsize,
    shutdown: AtomicBool,
    inject: Arc<Inject>,
}

impl Shared {
    /// Pushes one transfer's entry; the caller holds `submit_lock`.
    fn push(&self, op: Box<InFlight>) {
        let entry = op.entry();
        let user_data = Box::into_raw(op) as u64;
        let entry = entry.user_data(user_data);
        loop {
            // SAFETY: the caller holds `submit_lock`, so this is the only submission queue in
            // existence (the completion thread takes the lock too before pushing). The entry's
            // vectors and the folio memory they point to live in the boxed `InFlight`, which is
            // only reclaimed by the completion thread after the kernel posted this entry's
            // completion; the fd is kept open by the same box.
            let pushed = unsafe { self.ring.submission_shared().push(&entry).is_ok() };
            if pushed {
                return;
            }
            // The queue is full: hand what is queued to the kernel and retry.
            let _ = self.ring.submit();
        }
    }
}

pub(crate) struct Uring {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Uring {
    pub(crate) fn start(inject: Arc<Inject>) -> std::io::Result<Self> {
        let ring = IoUring::builder()
            .setup_cqsize(RING_ENTRIES * 2)
            .build(RING_ENTRIES)?;
        let shared = Arc::new(Shared {
            ring,
            submit_lock: Mutex::new(()),
            in_flight: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            inject,
        });
        let for_thread = Arc::clone(&shared);
        let thread =
            crate::mem::threads::spawn("foliocache-uring", move || complete_loop(&for_thread))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// The faults armed for this engine.
    pub(crate) fn inject(&self) -> &Inject {
        &self.shared.inject
    }

    pub(crate) fn submit(&self, fd: &Arc<OwnedFd>, transfers: Vec<Box<dyn Transfer>>, io: FileIo) {
        if transfers.is_empty() {
            return;
        }
        let shared = &self.shared;
        let _order = crate::sync::order::taking(crate::sync::order::Rank::Submit);
        let _guard = shared
            .submit_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for transfer in transfers {
            // An injected write error fails the write before it reaches the device (after the
            // fact, storage would have the bytes the error says it has not).
            if transfer.is_write()
                && let Some(errno) = shared.inject.take_write_error()
            {
                transfer.complete(Err(std::io::Error::from_raw_os_error(errno)));
                continue;
            }
            let mut op = Box::new(InFlight {
                all: transfer.io_vectors(),
                transfer,
                current: None,
                done: 0,
                fd: Arc::clone(fd),
                io,
            });
            op.start_at(0);
            shared.in_flight.fetch_add(1, Ordering::Relaxed);
            shared.push(op);
        }
        while let Err(error) = shared.ring.submit() {
            // EBUSY/EAGAIN: completions must be reaped first (the completion thread does),
            // EINTR: retry. Anything else leaves the entries queued for the completion
            // thread's next enter, which submits them too.
            match error.raw_os_error() {
                Some(libc::EBUSY | libc::EAGAIN | libc::EINTR) => std::thread::yield_now(),
                _ => break,
            }
        }
    }
}

impl Drop for Uring {
    fn drop(&mut self) {
        let shared = &self.shared;
        shared.shutdown.store(true, Ordering::Release);
        {
            let _guard = shared
                .submit_lock
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let wake = opcode::Nop::new().build().user_data(WAKE);
            loop {
                // SAFETY: `submit_lock` is held (one submission queue); a no-op points to no
                // memory.
                if unsafe { shared.ring.submission_shared().push(&wake).is_ok() } {
                    break;
                }
                let _ = shared.ring.submit();
            }
            let _ = shared.ring.submit();
        }
        if let Some(thread) = self.thread.take() {
            // The completion thread may be the one dropping the cache (completing the last
            // transfer released it): it cannot join itself, and it exits on its own.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

fn complete_loop(shared: &Shared) {
    let mut done: Vec<(u64, i32)> = Vec::with_capacity(RING_ENTRIES as usize * 2);
    // Continuations waiting for the submission lock.
    let mut pending: Vec<Box<InFlight>> = Vec::new();
    loop {
        if shared.shutdown.load(Ordering::Acquire) && shared.in_flight.load(Ordering::Acquire) == 0
        {
            return;
        }
        if !pending.is_empty()
            && let Ok(_guard) = shared.submit_lock.try_lock()
        {
            for op in pending.drain(..) {
                shared.push(op);
            }
        }
        let wait = if pending.is_empty() { 1 } else { 0 };
        // Wait for at least one completion (this also submits anything left queued); with
        // continuations still to push, only submit and come back.
        if let Err(error) = shared.ring.submit_and_wait(wait)
            && !matches!(
                error.raw_os_error(),
                Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)
            )
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        {
            // SAFETY: this thread is the only one that ever takes the completion queue.
            let completions = unsafe { shared.ring.completion_shared() };
            done.extend(completions.map(|cqe| (cqe.user_data(), cqe.result())));
        }
        if done.is_empty() && !pending.is_empty() {
            std::thread::yield_now();
        }
        for (user_data, result) in done.drain(..) {
            if user_data == WAKE {
                continue;
            }
            // SAFETY: every other `user_data` is a pointer from `Box::into_raw` in `push`, and
            // the kernel posts exactly one completion per entry, so it is reclaimed once.
            let op = unsafe { Box::from_raw(user_data as *mut InFlight) };
            // A panic while completing drops `op` as it unwinds: the transfer's own drop then
            // fails whatever it had not ended. This thread goes on.
            let next = catch_unwind(AssertUnwindSafe(|| step(&shared.inject, op, result)));
            match next {
                Ok(Some(op)) => {
                    match shared.submit_lock.try_lock() {
                        Ok(_guard) => shared.push(op),
                        Err(_) => pending.push(op),
                    }
                    continue;
                }
                Ok(None) | Err(_) => {
                    shared.in_flight.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
    }
}

/// Handles one completion of `op`: completes the transfer, or returns it set up for its
/// next entry (a continuation after a short transfer).
fn step(inject: &Inject, mut op: Box<InFlight>, result: i32) -> Option<Box<InFlight>> {
    let mut result = result;
    if !op.transfer.is_write() && inject.take(&inject.io_errors) {
        result = -libc::EIO;
    } else if result > 0 && inject.take(&inject.short_transfers) {
        let short = inject.short_bytes.load(Ordering::Relaxed);
        result = result.min(i32::try_from(short).unwrap_or(i32::MAX));
    }
    let outcome = match result {
        r if r == -libc::EINTR || r == -libc::EAGAIN => Ok(Some(op.done)),
        r if r < 0 => Err(std::io::Error::from_raw_os_error(-r)),
        moved => next_step(&*op.transfer, op.io, op.done, moved as usize),
    };
    match outcome {
        Ok(Some(restart)) => {
            op.start_at(restart);
            Some(op)
        }
        Ok(None) => {
            let moved = (op.done + result.max(0) as usize).min(op.transfer.len());
            finish(*op, Ok(moved));
            None
        }
        Err(error) => {
            finish(*op, Err(error));
            None
        }
    }
}

fn finish(op: InFlight, result: std::io::Result<usize>) {
    let InFlight {
        transfer, fd, io, ..
    } = op;
    if io.drop_behind {
        super::threads::drop_kernel_copy(&fd, transfer.offset(), transfer.len());
    }
    transfer.complete(result);
}
