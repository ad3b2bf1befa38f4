//! The fallback engine: a few threads doing `preadv` (when io_uring is unavailable).

use super::ReadRequest;
use crate::error::Error;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

/// Threads in the pool: enough to keep a few I/Os in flight on a small machine.
const THREADS: usize = 4;

struct Job {
    fd: Arc<OwnedFd>,
    request: ReadRequest,
    drop_behind: bool,
}

pub(crate) struct Pool {
    sender: Mutex<Option<Sender<Job>>>,
    threads: Vec<JoinHandle<()>>,
}

impl Pool {
    pub(crate) fn start() -> Result<Self, Error> {
        let (sender, receiver) = channel::<Job>();
        let receiver = Arc::new(Mutex::new(receiver));
        let mut threads = Vec::with_capacity(THREADS);
        for k in 0..THREADS {
            let receiver = Arc::clone(&receiver);
            let thread = std::thread::Builder::new()
                .name(format!("foliocache-io-{k}"))
                .spawn(move || worker(&receiver))
                .map_err(Error::Engine)?;
            threads.push(thread);
        }
        Ok(Self {
            sender: Mutex::new(Some(sender)),
            threads,
        })
    }

    pub(crate) fn submit(&self, fd: &Arc<OwnedFd>, requests: Vec<ReadRequest>, drop_behind: bool) {
        let sender = self.sender.lock().unwrap_or_else(PoisonError::into_inner);
        for request in requests {
            if let Some(sender) = sender.as_ref() {
                // A send fails only if every worker died; the request then drops and fails.
                let _ = sender.send(Job {
                    fd: Arc::clone(fd),
                    request,
                    drop_behind,
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
            // request: it cannot join itself, and it exits on its own.
            if thread.thread().id() != me {
                let _ = thread.join();
            }
        }
    }
}

fn worker(receiver: &Mutex<Receiver<Job>>) {
    loop {
        let job = {
            let receiver = receiver.lock().unwrap_or_else(PoisonError::into_inner);
            receiver.recv()
        };
        let Ok(job) = job else { return };
        let result = read_fully(&job.fd, &job.request);
        if job.drop_behind {
            drop_kernel_copy(&job.fd, job.request.offset(), job.request.len());
        }
        job.request.complete(result);
    }
}

/// Reads the request's range with `preadv`, continuing after short reads until it is full or
/// the file ends.
fn read_fully(fd: &OwnedFd, request: &ReadRequest) -> std::io::Result<usize> {
    let mut vectors = request.io_vectors();
    let mut done = 0usize;
    let mut first = 0usize;
    while first < vectors.len() {
        let count = (vectors.len() - first).min(1024);
        // SAFETY: the vectors describe the request's folios, which the request keeps
        // referenced, locked and not uptodate until it completes (after this call returns):
        // only this read writes them and nobody reads them (see `ReadRequest::targets`).
        let n = unsafe {
            libc::preadv(
                fd.as_raw_fd(),
                vectors[first..].as_ptr(),
                count as libc::c_int,
                (request.offset() + done as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        if n == 0 {
            break; // end of file
        }
        let mut n = n as usize;
        done += n;
        // Skip the vectors consumed and trim a partly filled one.
        while n > 0 && first < vectors.len() {
            let vector = &mut vectors[first];
            if n >= vector.iov_len {
                n -= vector.iov_len;
                first += 1;
            } else {
                vector.iov_base = vector.iov_base.cast::<u8>().wrapping_add(n).cast();
                vector.iov_len -= n;
                n = 0;
            }
        }
    }
    Ok(done)
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
