//! Memory the suites map or touch themselves: mappings that are unmapped when dropped, guest
//! memory warmed before a system fills a cache, and buffers faulted in before the clock starts.

use std::io;

/// A mapping made with `mmap`, unmapped when dropped: anonymous memory the suite reads and
/// writes, or a file mapped read-only and never touched (for `mincore`).
pub(crate) struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
    /// Whether it is anonymous memory (readable and writable), not a file's pages.
    anonymous: bool,
}

impl Mapping {
    /// A new private anonymous mapping of `len` bytes, readable and writable.
    pub(crate) fn anonymous(len: usize) -> io::Result<Self> {
        // SAFETY: a new private anonymous mapping at an address the kernel chooses; no existing
        // memory is affected, and it is unmapped once, in Drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            ptr,
            len,
            anonymous: true,
        })
    }

    /// A shared read-only mapping of the first `len` bytes of `file`, for [`Self::resident_pages`]:
    /// nothing reads through it.
    pub(crate) fn file(file: &std::fs::File, len: usize) -> io::Result<Self> {
        use std::os::fd::AsRawFd;
        // SAFETY: a new shared read-only mapping of an open file, at an address the kernel
        // chooses; it aliases nothing of ours, nothing reads through it, and it is unmapped
        // once, in Drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            ptr,
            len,
            anonymous: false,
        })
    }

    /// Advises transparent huge pages for the mapping (a refusal only means small pages).
    pub(crate) fn advise_huge(&self) {
        // SAFETY: advice on our own mapping of `len` bytes.
        unsafe { libc::madvise(self.ptr, self.len, libc::MADV_HUGEPAGE) };
    }

    /// The bytes of an anonymous mapping. Panics for a file's mapping, which is read-only.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        assert!(self.anonymous, "a file's mapping is read-only");
        // SAFETY: the mapping is `len` readable and writable bytes owned by `self`; the borrow
        // of `self` keeps it mapped and unaliased for the slice's life.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.cast::<u8>(), self.len) }
    }

    /// The mapping's bytes, read-only (a file's mapping, or an anonymous one).
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is `len` readable bytes owned by `self`, mapped for the borrow's
        // life; nothing in this process writes a file's mapping, and an anonymous one only
        // through `bytes_mut`, which needs `&mut self`.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }

    /// How many of the mapping's 4 KiB pages are in memory (`mincore`): for a file's mapping,
    /// its pages in the kernel's page cache.
    pub(crate) fn resident_pages(&self) -> io::Result<u64> {
        let mut vec = vec![0u8; self.len.div_ceil(4096)];
        // SAFETY: `ptr` is our live mapping of `len` bytes (page aligned, from mmap), and `vec`
        // has one byte per page of it, as mincore writes.
        let rc = unsafe { libc::mincore(self.ptr, self.len, vec.as_mut_ptr()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(vec.iter().filter(|b| **b & 1 != 0).count() as u64)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are the mapping made by the constructor, unmapped only here;
        // nothing refers into it any more (slices of it borrowed `self`).
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// Warms `bytes` of guest memory for whichever system runs next, then gives it back: this VM hands
/// idle free memory to the host, and a first touch afterwards is slow (`docs/BENCHMARKS.md`). The
/// memory is mapped with huge pages advised and written, so it returns to the kernel's free lists
/// as whole 2 MiB blocks: the kernel's page cache (which splits them for its folios) and
/// foliocache's arena (which faults in huge pages) can both reuse them. A `Vec` freed instead
/// leaves 4 KiB pages that rarely merge back in time; measured with a probe after a 4 s idle, a
/// following 128 MiB huge-page populate ran at 0.8–1.5 GB/s after that, and at 13 GB/s after this.
pub(crate) fn warm_guest_memory(bytes: usize) {
    const HUGE: usize = 2 << 20;
    let len = bytes.next_multiple_of(HUGE);
    if len == 0 {
        return;
    }
    let Ok(mut map) = Mapping::anonymous(len) else {
        return;
    };
    map.advise_huge();
    map.bytes_mut().fill(1);
}

/// A buffer of `bytes` whose every page was written (faulted in, host-resident).
pub(crate) fn touched_buffer(bytes: usize) -> Vec<u8> {
    let mut buffer = vec![0u8; bytes];
    buffer.fill(1);
    buffer
}

#[cfg(test)]
mod tests {
    use super::Mapping;

    #[test]
    fn an_anonymous_mapping_is_written_and_resident() {
        let mut map = Mapping::anonymous(4 * 4096).unwrap();
        map.bytes_mut()[..4096].fill(7);
        assert_eq!(map.bytes_mut()[4095], 7);
        assert!(map.resident_pages().unwrap() >= 1);
    }

    #[test]
    fn a_file_mapping_sees_the_page_cache() {
        let path = std::env::temp_dir().join(format!("fcache-mapping-{}", std::process::id()));
        std::fs::write(&path, vec![1u8; 3 * 4096]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let map = Mapping::file(&file, 3 * 4096).unwrap();
        // Just written: its pages are in the kernel's cache.
        assert_eq!(map.resident_pages().unwrap(), 3);
        drop(map);
        let _ = std::fs::remove_file(&path);
    }
}
