//! The io_uring engine: one ring per cache. Readers push one `READV` per request and submit
//! the whole readahead batch with one `io_uring_enter`; a completion thread (the kernel's
//! interrupt handler, in effect) reaps completions and ends the reads.

use super::ReadRequest;
use super::threads::drop_kernel_copy;
use io_uring::{IoUring, opcode, types};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

/// Submission queue entries (the completion queue is twice as large).
const RING_ENTRIES: u32 = 256;
/// `user_data` of the no-op that wakes the completion thread for shutdown.
const WAKE: u64 = u64::MAX;

/// One read in flight: owns its request, its vectors and the file until the completion.
struct InFlight {
    request: ReadRequest,
    vectors: Vec<libc::iovec>,
    fd: Arc<OwnedFd>,
    drop_behind: bool,
}

struct Shared {
    ring: IoUring,
    /// Serialises access to the submission queue (one producer at a time).
    submit_lock: Mutex<()>,
    in_flight: AtomicUsize,
    shutdown: AtomicBool,
}

pub(crate) struct Uring {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Uring {
    pub(crate) fn start() -> std::io::Result<Self> {
        let ring = IoUring::builder()
            .setup_cqsize(RING_ENTRIES * 2)
            .build(RING_ENTRIES)?;
        let shared = Arc::new(Shared {
            ring,
            submit_lock: Mutex::new(()),
            in_flight: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
        });
        let for_thread = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("foliocache-uring".to_owned())
            .spawn(move || complete_loop(&for_thread))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    pub(crate) fn submit(&self, fd: &Arc<OwnedFd>, requests: Vec<ReadRequest>, drop_behind: bool) {
        if requests.is_empty() {
            return;
        }
        let shared = &self.shared;
        let _guard = shared
            .submit_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for request in requests {
            let vectors = request.io_vectors();
            let offset = request.offset();
            let op = Box::new(InFlight {
                request,
                vectors,
                fd: Arc::clone(fd),
                drop_behind,
            });
            let entry = opcode::Readv::new(
                types::Fd(op.fd.as_raw_fd()),
                op.vectors.as_ptr(),
                op.vectors.len() as u32,
            )
            .offset(offset)
            .build();
            let user_data = Box::into_raw(op) as u64;
            let entry = entry.user_data(user_data);
            shared.in_flight.fetch_add(1, Ordering::Relaxed);
            loop {
                // SAFETY: `submit_lock` is held, so this is the only submission queue in
                // existence (the completion thread never touches it). The entry's vectors and
                // the folio memory they point to live in the boxed `InFlight`, which is only
                // reclaimed by the completion thread after the kernel posted this entry's
                // completion; the fd is kept open by the same box.
                let pushed = unsafe { shared.ring.submission_shared().push(&entry).is_ok() };
                if pushed {
                    break;
                }
                // The queue is full: hand what is queued to the kernel and retry.
                let _ = shared.ring.submit();
            }
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
            // read released it): it cannot join itself, and it exits on its own.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

fn complete_loop(shared: &Shared) {
    let mut done: Vec<(u64, i32)> = Vec::with_capacity(RING_ENTRIES as usize * 2);
    loop {
        if shared.shutdown.load(Ordering::Acquire) && shared.in_flight.load(Ordering::Acquire) == 0
        {
            return;
        }
        // Wait for at least one completion (this also submits anything left queued).
        if let Err(error) = shared.ring.submit_and_wait(1)
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
        for (user_data, result) in done.drain(..) {
            if user_data == WAKE {
                continue;
            }
            // SAFETY: every other `user_data` is a pointer from `Box::into_raw` in `submit`,
            // and the kernel posts exactly one completion per entry, so it is reclaimed once.
            let op = unsafe { Box::from_raw(user_data as *mut InFlight) };
            let InFlight {
                request,
                vectors,
                fd,
                drop_behind,
            } = *op;
            drop(vectors);
            if drop_behind {
                drop_kernel_copy(&fd, request.offset(), request.len());
            }
            let result = if result < 0 {
                Err(std::io::Error::from_raw_os_error(-result))
            } else {
                Ok(result as usize)
            };
            let result = match result {
                // A short read before end of file (rare with O_DIRECT): finish it with plain
                // reads rather than fail the folios.
                Ok(n) if n < request.len() => finish_short(&fd, &request, n),
                other => other,
            };
            request.complete(result);
            shared.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Completes a short read synchronously: reads the rest with `pread` until the request is full
/// or the file ends.
fn finish_short(fd: &OwnedFd, request: &ReadRequest, mut done: usize) -> std::io::Result<usize> {
    let vectors = request.io_vectors();
    while done < request.len() {
        // Find the vector holding byte `done`.
        let mut skip = done;
        let Some(vector) = vectors.iter().find(|v| {
            if skip < v.iov_len {
                true
            } else {
                skip -= v.iov_len;
                false
            }
        }) else {
            break;
        };
        let base = vector.iov_base.cast::<u8>().wrapping_add(skip);
        let len = vector.iov_len - skip;
        // SAFETY: `base..base + len` lies inside one of the request's folios, which are
        // referenced, locked and not uptodate until the request completes (after this
        // returns): only this read writes them (see `ReadRequest::targets`).
        let n = unsafe {
            libc::pread(
                fd.as_raw_fd(),
                base.cast(),
                len,
                (request.offset() + done as u64) as libc::off_t,
            )
        };
        match n {
            0 => break,
            n if n < 0 => {
                let error = std::io::Error::last_os_error();
                if error.kind() != std::io::ErrorKind::Interrupted {
                    return Err(error);
                }
            }
            n => done += n as usize,
        }
    }
    Ok(done)
}
