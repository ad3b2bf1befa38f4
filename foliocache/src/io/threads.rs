//! The fallback engine: a few threads doing `preadv2`/`pwritev2` (when io_uring is unavailable).
//! A transfer cut short is continued from where it stopped (rounded down to the file's block
//! size); a panic while completing one is caught, that transfer fails, the worker goes on.

use super::{FileIo, Transfer, next_step, vectors_from};
use crate::error::Error;
use crate::inject::Inject;
use std::os::fd::{AsRawFd, OwnedFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

/// Threads in the pool: enough to keep a few I/Os in flight on a small machine.
const THREADS: usize = 4;

struct Job {
    fd: Arc<OwnedFd>,
    transfer: Box<dyn Transfer>,
    io: FileIo,
}

pub(crate) struct Pool {
    sender: Mutex<Option<Sender<Job>>>,
    inject: Arc<Inject>,
    threads: Vec<JoinHandle<()>>,
}

impl Pool {
    pub(crate) fn start(inject: Arc<Inject>) -> Result<Self, Error> {
        let (sender, receiver) = channel::<Job>();
        let receiver = Arc::new(Mutex::new(receiver));
        let mut threads = Vec::with_capacity(THREADS);
        for k in 0..THREADS {
            let receiver = Arc::clone(&receiver);
            let inject = Arc::clone(&inject);
            let thread = crate::mem::threads::spawn(&format!("foliocache-io-{k}"), move || {
                worker(&receiver, &inject);
            })
            .map_err(Error::Engine)?;
            threads.push(thread);
        }
        Ok(Self {
            sender: Mutex::new(Some(sender)),
            inject,
            threads,
        })
    }

    /// The faults armed for this engine.
    pub(crate) fn inject(&self) -> &Inject {
        &self.inject
    }

    pub(crate) fn submit(&self, fd: &Arc<OwnedFd>, transfers: Vec<Box<dyn Transfer>>, io: FileIo) {
        let sender = self.sender.lock().unwrap_or_else(PoisonError::into_inner);
        for transfer in transfers {
            if let Some(sender) = sender.as_ref() {
                // A send fails only if every worker died; the transfer then drops and fails.
                let _ = sender.send(Job {
                    fd: Arc::clone(fd),
                    transfer,
                    io,
                });
            }
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Closing the channel ends the workers once the queue is empty.
        self.sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let me = std::thread::current().id();
        for thread in self.threads.drain(..) {
            // The last reference to the cache may be dropped by a worker completing the last
            // transfer: it cannot join itself, and it exits on its own.
            if thread.thread().id() != me {
                let _ = thread.join();
            }
        }
    }
}

fn worker(receiver: &Mutex<Receiver<Job>>, inject: &Inject) {
    loop {
        let job = {
            let receiver = receiver.lock().unwrap_or_else(PoisonError::into_inner);
            receiver.recv()
        };
        let Ok(job) = job else { return };
        let Job { fd, transfer, io } = job;
        run_now(&fd, transfer, io, inject);
    }
}

/// Does one transfer in the calling thread and completes it (a worker's job, and a reader's
/// own read, `DirectFile::read_now`). A panic while completing drops the transfer as it
/// unwinds: its own drop then fails whatever it had not ended, and the caller goes on.
pub(super) fn run_now(fd: &OwnedFd, transfer: Box<dyn Transfer>, io: FileIo, inject: &Inject) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let result = transfer_fully(fd, &*transfer, io, inject);
        if io.drop_behind {
            drop_kernel_copy(fd, transfer.offset(), transfer.len());
        }
        transfer.complete(result);
    }));
}

/// Moves the transfer's bytes with `preadv`/`pwritev`, continuing after short transfers until
/// it is whole (or a read reaches the end of the file).
fn transfer_fully(
    fd: &OwnedFd,
    transfer: &dyn Transfer,
    io: FileIo,
    inject: &Inject,
) -> std::io::Result<usize> {
    // An injected write error fails the write before it reaches the device.
    if transfer.is_write()
        && let Some(errno) = inject.take_write_error()
    {
        return Err(std::io::Error::from_raw_os_error(errno));
    }
    let all = transfer.io_vectors();
    let mut done = 0usize;
    loop {
        let vectors = vectors_from(&all, done);
        let offset = (transfer.offset() + done as u64) as libc::off_t;
        let n = if transfer.is_write() {
            // SAFETY: the vectors describe the transfer's folios, which it keeps referenced
            // and unchanged until it completes (after this call returns); the kernel only
            // reads them.
            unsafe {
                libc::pwritev2(
                    fd.as_raw_fd(),
                    vectors.as_ptr(),
                    vectors.len() as libc::c_int,
                    offset,
                    io.write_flags,
                )
            }
        } else {
            // SAFETY: the vectors describe the transfer's folios, which it keeps referenced,
            // locked and not uptodate until it completes (after this call returns): only this
            // read writes them and nobody reads them (see `ReadRequest::targets`).
            unsafe {
                libc::preadv2(
                    fd.as_raw_fd(),
                    vectors.as_ptr(),
                    vectors.len() as libc::c_int,
                    offset,
                    io.read_flags,
                )
            }
        };
        if n < 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        let mut moved = n as usize;
        if !transfer.is_write() && inject.take(&inject.io_errors) {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        if moved > 0 && inject.take(&inject.short_transfers) {
            let short = inject
                .short_bytes
                .load(std::sync::atomic::Ordering::Relaxed);
            moved = moved.min(usize::try_from(short).unwrap_or(usize::MAX));
        }
        match next_step(transfer, io, done, moved)? {
            Some(restart) => done = restart,
            None => return Ok((done + moved).min(transfer.len())),
        }
    }
}

/// Drops the kernel's cached copy of a range read in buffered mode (no double caching).
pub(super) fn drop_kernel_copy(fd: &OwnedFd, offset: u64, len: usize) {
    let _ = rustix::fs::fadvise(
        fd,
        offset,
        std::num::NonZeroU64::new(len as u64),
        rustix::fs::Advice::DontNeed,
    );
}
