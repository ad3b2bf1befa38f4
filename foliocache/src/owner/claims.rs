//! One file, one cache, machine-wide (`docs/SHARED.md`, "One file, one cache").
//!
//! Two caches holding the same file are two copies again: each would serve its own pages, and
//! in write-back mode each would write whole pages back over the other's writes. So the owner
//! of a shared cache claims every file it serves in a file every cache on the machine uses
//! (`/tmp/.foliocache-claims`, `FOLIOCACHE_CLAIMS` to choose another), with an open file
//! description lock on one byte named by a hash of the file's (device, inode): a file another
//! cache (another name, another user) has claimed is refused, and its clients pass it through.
//! The kernel drops an owner's claims when it dies; the next owner claims its files again as it
//! opens them. A private cache does not claim: its leases already keep it off a file another
//! process has open for writing (the owner holds its files open).
//!
//! Any user can lock bytes of the claims file, so a user can make any file pass through every
//! cache (never make a cache serve wrong bytes). Two files whose hashes meet pass through in
//! the second cache, which is as safe.

use super::log;
use crate::io::claim;
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// The claims file every cache of the machine shares (`FOLIOCACHE_CLAIMS` wins).
pub(crate) fn path() -> PathBuf {
    std::env::var_os("FOLIOCACHE_CLAIMS")
        .map_or_else(|| PathBuf::from("/tmp/.foliocache-claims"), PathBuf::from)
}

/// The byte of the claims file that stands for a file: FNV-1a of its key, below 2^40.
fn byte_of(key: (u64, u64)) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.0.to_le_bytes().into_iter().chain(key.1.to_le_bytes()) {
        hash = (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash & ((1 << 40) - 1)
}

/// An owner's claims.
pub(super) struct Claims {
    /// The claims file (`None`: it could not be opened; nothing is claimed, and the status
    /// says so).
    fd: Option<OwnedFd>,
    held: Mutex<HashMap<(u64, u64), u64>>,
    /// Opens refused because another cache holds the file.
    pub(super) refused: AtomicU64,
}

impl Claims {
    pub(super) fn open(name: &str) -> Self {
        use rustix::fs::{Mode, OFlags};
        let path = path();
        let flags = OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        let all = Mode::from_raw_mode(0o666);
        // Made by the first cache, readable and lockable by every user's; an existing one is
        // opened as it is (never through a symlink, never chmod'ed).
        let fd = match rustix::fs::open(&path, flags | OFlags::CREATE | OFlags::EXCL, all) {
            Ok(fd) => {
                let _ = rustix::fs::fchmod(&fd, all);
                Ok(fd)
            }
            Err(rustix::io::Errno::EXIST) => rustix::fs::open(&path, flags, Mode::empty()),
            Err(e) => Err(e),
        };
        let fd = match fd {
            Ok(fd) => Some(fd),
            Err(e) => {
                log(
                    name,
                    &format!(
                        "cannot open the claims file {}: {e}; files are not claimed \
                         machine-wide",
                        path.display()
                    ),
                );
                None
            }
        };
        Self {
            fd,
            held: Mutex::new(HashMap::new()),
            refused: AtomicU64::new(0),
        }
    }

    /// Whether this cache may serve the file `key`: claimed now or before by this owner.
    pub(super) fn claim(&self, key: (u64, u64)) -> bool {
        let Some(fd) = &self.fd else { return true };
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.contains_key(&key) {
            return true;
        }
        let byte = byte_of(key);
        match claim::try_lock_byte(fd.as_fd(), byte) {
            Ok(true) => {
                held.insert(key, byte);
                true
            }
            Ok(false) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                false
            }
            // A failure to lock is not another cache's claim: serve (as without the file).
            Err(_) => true,
        }
    }

    /// The file `key` left this cache.
    pub(super) fn release(&self, key: (u64, u64)) {
        let Some(fd) = &self.fd else { return };
        let byte = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&key);
        if let Some(byte) = byte
            // Another held key may share the byte (a hash collision): keep it then.
            && !self
                .held
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .values()
                .any(|&b| b == byte)
        {
            let _ = claim::unlock_byte(fd.as_fd(), byte);
        }
    }

    /// For the status: the claims file, or why there is none.
    pub(super) fn describe(&self) -> String {
        match &self.fd {
            Some(_) => path().display().to_string(),
            None => "none (files are not claimed machine-wide)".to_owned(),
        }
    }
}
