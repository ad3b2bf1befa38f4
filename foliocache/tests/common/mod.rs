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
    /// Page index → reads of it left to fail (u32::MAX: always).
    pub failing: Mutex<HashMap<u64, u32>>,
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
        let n = size
            .saturating_sub(request.offset())
            .min(request.len() as u64) as usize;
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
                let failing: HashMap<u64, u32> = self.failing.lock().unwrap().clone();
                std::thread::spawn(move || {
                    std::thread::sleep(delay);
                    let helper = MemBackend {
                        data,
                        failing: Mutex::new(failing),
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
