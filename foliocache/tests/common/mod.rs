//! Shared test helpers: a test backend (file bytes in memory, reads completed inline or on a
//! thread, chosen pages failing), and the stress tests' duration.

#![allow(dead_code, unreachable_pub)]

use foliocache::{Backend, ReadRequest};
use std::collections::HashMap;
use std::io;
use std::sync::Mutex;
use std::time::Duration;

/// The byte at `pos` of a test file: varies with the page and the offset in it.
pub fn byte_at(pos: u64) -> u8 {
    ((pos >> 12).wrapping_mul(131) ^ (pos & 4095).wrapping_mul(7)) as u8
}

pub fn pattern(len: u64) -> Vec<u8> {
    (0..len).map(byte_at).collect()
}

#[derive(Debug, Default)]
pub struct MemBackend {
    pub data: Vec<u8>,
    /// Page index → reads of it left to fail (u32::MAX: always). Shared with the threads that
    /// serve delayed requests, so a count goes down whoever serves the read.
    pub failing: std::sync::Arc<Mutex<HashMap<u64, u32>>>,
    /// Requests left to complete short: with half their bytes (rounded down to a page), as a
    /// backend may before end of file. The request then fails the folios it did not reach.
    pub short: std::sync::Arc<std::sync::atomic::AtomicU32>,
    /// Complete on another thread after this delay (None: inline, inside `submit`).
    pub delay: Option<Duration>,
    /// Every request seen: (offset, len).
    pub log: Mutex<Vec<(u64, usize)>>,
    /// Batches submitted.
    pub submits: Mutex<u64>,
}

impl MemBackend {
    pub fn new(data: Vec<u8>) -> Self {
        Self {
            data,
            ..Self::default()
        }
    }

    pub fn fail_page(&self, page: u64, times: u32) {
        self.failing.lock().unwrap().insert(page, times);
    }

    pub fn requests(&self) -> Vec<(u64, usize)> {
        self.log.lock().unwrap().clone()
    }

    fn serve(&self, mut request: ReadRequest) {
        let first = request.offset() >> 12;
        let pages = request.len() as u64 >> 12;
        let fail = {
            let mut failing = self.failing.lock().unwrap();
            let mut fail = false;
            for page in first..first + pages {
                if let Some(left) = failing.get_mut(&page)
                    && *left > 0
                {
                    fail = true;
                    if *left != u32::MAX {
                        *left -= 1;
                    }
                }
            }
            fail
        };
        if fail {
            request.complete(Err(io::Error::from_raw_os_error(5)));
            return;
        }
        let size = self.data.len() as u64;
        for (offset, bytes) in request.targets() {
            for (k, byte) in bytes.iter_mut().enumerate() {
                let pos = offset + k as u64;
                // Past end of file: garbage, which the cache must never return.
                *byte = if pos < size {
                    self.data[pos as usize]
                } else {
                    0xEE
                };
            }
        }
        let mut n = size
            .saturating_sub(request.offset())
            .min(request.len() as u64) as usize;
        let cut = self
            .short
            .fetch_update(
                std::sync::atomic::Ordering::Relaxed,
                std::sync::atomic::Ordering::Relaxed,
                |left| left.checked_sub(1),
            )
            .is_ok();
        if cut && n == request.len() && n > 4096 {
            n = (n / 2) & !4095;
        }
        request.complete(Ok(n));
    }
}

impl Backend for MemBackend {
    fn size(&self) -> u64 {
        self.data.len() as u64
    }

    fn submit(&self, requests: Vec<ReadRequest>) {
        *self.submits.lock().unwrap() += 1;
        {
            let mut log = self.log.lock().unwrap();
            log.extend(requests.iter().map(|r| (r.offset(), r.len())));
        }
        match self.delay {
            None => requests.into_iter().for_each(|r| self.serve(r)),
            Some(delay) => {
                // Serve on a thread: readers really wait on locked folios. The backend is
                // shared through the file's Arc, so copy what the thread needs.
                let data = self.data.clone();
                let failing = std::sync::Arc::clone(&self.failing);
                let short = std::sync::Arc::clone(&self.short);
                std::thread::spawn(move || {
                    std::thread::sleep(delay);
                    let helper = MemBackend {
                        data,
                        failing,
                        short,
                        ..MemBackend::default()
                    };
                    for request in requests {
                        helper.serve(request);
                    }
                });
            }
        }
    }
}

/// The stress tests' time budget: `FOLIOCACHE_STRESS_SECS` seconds (default 2; `.ci/run` sets
/// it). A test that runs several phases takes a fraction of it for each.
pub fn stress_duration() -> Duration {
    let secs = std::env::var("FOLIOCACHE_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(2.0);
    Duration::from_secs_f64(secs)
}

/// Runs the test `name` of this test binary again in a child process, with `FOLIOCACHE_CHILD`
/// set to `role`, and returns how the child ended. The test checks the variable first thing
/// and, in the child, does the part that must run alone (set a resource limit, abort on
/// purpose). Output of the child is passed through.
pub fn run_child(name: &str, role: &str) -> std::process::ExitStatus {
    run_child_with(name, role, &[])
}

/// [`run_child`] with more variables in the child's environment.
pub fn run_child_with(name: &str, role: &str, vars: &[(&str, &str)]) -> std::process::ExitStatus {
    let exe = std::env::current_exe().expect("the test binary's path");
    std::process::Command::new(exe)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env("FOLIOCACHE_CHILD", role)
        .envs(vars.iter().copied())
        .status()
        .expect("run the test binary again")
}

/// In a child started by [`run_child`]: its role.
pub fn child_role() -> Option<String> {
    std::env::var("FOLIOCACHE_CHILD").ok()
}

/// A test that cannot run here says why. Outside CI it passes with that line printed; in CI
/// (`CI` set, as `.ci/run` does) it fails, unless `FOLIOCACHE_ALLOW_SKIP` is set (to anything:
/// the environment says the skip is expected).
pub fn skip(why: &str) {
    let in_ci = std::env::var_os("CI").is_some();
    let allowed = std::env::var_os("FOLIOCACHE_ALLOW_SKIP").is_some();
    if in_ci && !allowed {
        panic!("skipped in CI: {why} (set FOLIOCACHE_ALLOW_SKIP=1 if this is expected here)");
    }
    eprintln!("SKIPPED: {why}");
}

/// Runs `f` on its own thread and waits at most `limit` for it: a test that deadlocks fails
/// (with `what` in the message) instead of hanging `cargo test`. A panic in `f` fails the test
/// with the same message.
pub fn with_deadline<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (done, result) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        let _ = done.send(f());
    });
    match result.recv_timeout(limit) {
        Ok(value) => {
            let _ = worker.join();
            value
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match worker.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => panic!("{what}: the worker ended without a result"),
        },
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: no result within {limit:?} (a hang)")
        }
    }
}

/// A file of `size` bytes of [`pattern`] under the target directory (on the checkout's file
/// system: a disk here, not tmpfs), named `name`.
pub fn test_file(name: &str, size: u64) -> std::path::PathBuf {
    use std::io::Write;
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let mut file = std::fs::File::create(&path).unwrap();
    file.write_all(&pattern(size)).unwrap();
    file.sync_all().unwrap();
    path
}

/// Caches built by `build` with each I/O engine that can run here, each with a file of `path`
/// opened (O_DIRECT). An engine or a file system that cannot is skipped with [`skip`].
pub fn per_engine(
    build: impl Fn(foliocache::EngineKind) -> foliocache::Cache,
    path: &std::path::Path,
) -> Vec<(foliocache::EngineKind, foliocache::Cache, foliocache::File)> {
    use foliocache::{EngineKind, Error};
    let mut out = Vec::new();
    for kind in [EngineKind::IoUring, EngineKind::Threads] {
        let cache = build(kind);
        match cache.open(path) {
            Ok(file) => out.push((kind, cache, file)),
            Err(Error::NoDirectIo { .. }) => {
                skip("the target directory's file system has no direct I/O");
                return out;
            }
            Err(Error::Engine(error)) => skip(&format!("{kind:?}: {error}")),
            Err(error) => panic!("{kind:?}: {error}"),
        }
    }
    out
}

pub mod versions;

/// Joins `thread`, waiting at most `limit`: a thread that does not end in time fails the test
/// (a hang), and a thread that panicked fails it with its own message.
pub fn join_within(thread: std::thread::JoinHandle<()>, limit: Duration, what: &str) {
    let start = std::time::Instant::now();
    while !thread.is_finished() {
        assert!(
            start.elapsed() < limit,
            "{what} did not end within {limit:?} of being stopped (a hang)"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    if let Err(panic) = thread.join() {
        std::panic::resume_unwind(panic);
    }
}

/// One stress worker: loops until the stop flag is set, bumping its progress counter.
pub type Worker =
    Box<dyn FnOnce(&std::sync::atomic::AtomicBool, &std::sync::atomic::AtomicU64) + Send>;

/// How long a stress worker may go without progress before the run fails as stalled: half
/// the run (so a stall is caught within the run), at least 0.5 s (threads of a busy 2-CPU
/// machine can be descheduled for a while) and at most 3 s.
pub fn stall_limit(time: Duration) -> Duration {
    (time / 2).clamp(Duration::from_millis(500), Duration::from_secs(3))
}

/// Runs `workers` on threads of their own for `time`, watching them: a worker that makes no
/// progress for [`stall_limit`] fails the run (a deadlock or a hang), as does one that does
/// not end within 10 s of the stop, or one that panics (with its own message). Returns each
/// worker's progress count.
pub fn run_stress(time: Duration, workers: Vec<Worker>) -> Vec<u64> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let stop = Arc::new(AtomicBool::new(false));
    let progress: Vec<Arc<AtomicU64>> = workers.iter().map(|_| Arc::default()).collect();
    let threads: Vec<_> = workers
        .into_iter()
        .zip(&progress)
        .map(|(work, counter)| {
            let (stop, counter) = (Arc::clone(&stop), Arc::clone(counter));
            std::thread::spawn(move || work(&stop, &counter))
        })
        .collect();
    let stall = stall_limit(time);
    let start = std::time::Instant::now();
    let mut last: Vec<(u64, std::time::Instant)> = progress.iter().map(|_| (0, start)).collect();
    let mut failure = None;
    while start.elapsed() < time && failure.is_none() {
        std::thread::sleep(Duration::from_millis(20));
        for (k, (count, since)) in last.iter_mut().enumerate() {
            let now = progress[k].load(Ordering::Relaxed);
            if threads[k].is_finished() {
                failure = Some(format!("worker {k} ended early (it panicked?)"));
            } else if now != *count {
                *count = now;
                *since = std::time::Instant::now();
            } else if since.elapsed() > stall {
                failure = Some(format!(
                    "worker {k} made no progress for {stall:?} (a hang?)"
                ));
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for (k, thread) in threads.into_iter().enumerate() {
        join_within(thread, Duration::from_secs(10), &format!("worker {k}"));
    }
    if let Some(failure) = failure {
        panic!("{failure}");
    }
    progress.iter().map(|p| p.load(Ordering::Relaxed)).collect()
}

/// Keeps the panics that tests inject on purpose (their message says "injected") from
/// filling the output; every other panic is reported as usual.
pub fn quiet_injected_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            if !message.contains("injected") {
                default(info);
            }
        }));
    });
}
