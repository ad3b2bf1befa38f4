//! foliocache's side of `ra-diff`: the same trace on one handle of a fresh cache, the pages
//! cached after each operation once its reads have arrived.

use super::pages::PageSet;
use crate::trace::Op;
use foliocache::{Advice, Backend, Cache, File, OpenOptions, PageState, ReadRequest};
use std::path::Path;
use std::sync::Arc;

const PAGE: u64 = 4096;

/// What foliocache is run with (the kernel's settings it is compared to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Setting {
    /// The maximum window (`read_ahead_kb`).
    pub(crate) ra_kb: u64,
    /// The device's largest request (`max_sectors_kb`, the kernel's `bdi->io_pages`).
    pub(crate) io_kb: u64,
    /// The largest folio order (ext4 allows 9 on x86-64 since 6.16).
    pub(crate) max_order: u8,
}

/// Where foliocache's bytes come from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Source<'a> {
    /// A file on a disk, read with O_DIRECT.
    Disk(&'a Path),
    /// A file of this size whose bytes are zeros, served at once from memory: the decisions
    /// are the same, with no device needed (recorded comparisons run anywhere).
    Synthetic(u64),
}

/// A backend of zeros that completes every read inside `submit`.
#[derive(Debug)]
struct Zeros {
    size: u64,
}

impl Backend for Zeros {
    fn size(&self) -> u64 {
        self.size
    }

    fn submit(&self, requests: Vec<ReadRequest>) {
        for mut request in requests {
            for (_, bytes) in request.targets() {
                bytes.fill(0);
            }
            let arrived = self
                .size
                .saturating_sub(request.offset())
                .min(request.len() as u64);
            request.complete(Ok(arrived as usize));
        }
    }

    fn describe(&self) -> String {
        "synthetic (zeros from memory)".into()
    }
}

/// The pages `posix_fadvise(DONTNEED)` drops for `offset, len` on a file of `size` bytes: only
/// whole pages (the kernel keeps partial pages at both ends, except the file's last page), as
/// `(first, last)`; `None` if none.
pub(crate) fn dont_need_pages(offset: u64, len: u64, size: u64) -> Option<(u64, u64)> {
    let end_byte = match offset.checked_add(len) {
        Some(end) if len > 0 && end <= i64::MAX as u64 => end - 1,
        _ => i64::MAX as u64,
    };
    let first = offset.div_ceil(PAGE);
    let mut last = end_byte / PAGE;
    if end_byte % PAGE != PAGE - 1 && size.checked_sub(1) != Some(end_byte) {
        last = last.checked_sub(1)?;
    }
    (last >= first).then_some((first, last))
}

fn open(cache: &Cache, source: Source<'_>, setting: Setting) -> Result<File, String> {
    match source {
        Source::Disk(path) => cache
            .open_with(path, OpenOptions::new().max_order(setting.max_order))
            .map_err(|e| match e {
                foliocache::Error::NoDirectIo { .. } => format!(
                    "unavailable: foliocache cannot open {} with O_DIRECT: {e}",
                    path.display()
                ),
                e => format!("foliocache cannot open {}: {e}", path.display()),
            }),
        Source::Synthetic(size) => cache
            .open_backend(Arc::new(Zeros { size }), Some(setting.max_order))
            .map_err(|e| e.to_string()),
    }
}

/// The cached pages (uptodate) of `file`.
fn cached(file: &File) -> PageSet {
    let mut set = PageSet::new();
    for range in file.cached_ranges() {
        if range.state == PageState::Uptodate {
            for page in range.first..range.first + range.pages {
                set.insert(page);
            }
        }
    }
    set
}

/// Replays `ops` on a fresh cache over `source`; the pages after each operation.
pub(crate) fn run(
    source: Source<'_>,
    ops: &[Op],
    setting: Setting,
) -> Result<Vec<PageSet>, String> {
    let size = match source {
        Source::Disk(path) => std::fs::metadata(path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?
            .len(),
        Source::Synthetic(size) => size,
    };
    // Room for the whole file twice over: nothing is evicted during a trace.
    let capacity = (size.div_ceil(PAGE) * PAGE * 2).max(64 << 20);
    let cache = Cache::builder()
        .capacity(capacity)
        .readahead_bytes(setting.ra_kb << 10)
        .max_io_bytes(setting.io_kb << 10)
        .build()
        .map_err(|e| format!("cannot build a cache of {capacity} bytes: {e}"))?;
    let file = open(&cache, source, setting)?;
    let mut handle = file.handle();
    let mut buf = Vec::new();
    let mut steps = Vec::with_capacity(ops.len());
    for op in ops {
        match *op {
            Op::Read { offset, len } => {
                buf.resize(len as usize, 0);
                // Errors and short reads show in the page set, as on the kernel's side.
                let _ = handle.read_at(&mut buf, offset);
            }
            Op::WillNeed { offset, len } => {
                let len = if len == 0 {
                    size.saturating_sub(offset)
                } else {
                    len
                };
                let _ = handle.advise(Advice::WillNeed { offset, len });
            }
            Op::DontNeed { offset, len } => {
                if let Some((first, last)) = dont_need_pages(offset, len, size) {
                    file.drop_cached(first * PAGE, (last - first + 1) * PAGE);
                }
            }
        }
        file.wait_for_io();
        steps.push(cached(&file));
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dont_need_keeps_partial_pages_as_the_kernel_does() {
        let size = 100 * PAGE;
        assert_eq!(dont_need_pages(0, 8 * PAGE, size), Some((0, 7)));
        assert_eq!(dont_need_pages(1, 8 * PAGE, size), Some((1, 7)));
        assert_eq!(dont_need_pages(0, 8 * PAGE - 1, size), Some((0, 6)));
        assert_eq!(dont_need_pages(0, 100, size), None);
        assert_eq!(dont_need_pages(5 * PAGE, 0, size), Some((5, (1 << 51) - 1)));
        // The file's last byte ends the range: its partial last page goes too.
        assert_eq!(
            dont_need_pages(0, 10 * PAGE + 7, 10 * PAGE + 7),
            Some((0, 10))
        );
    }
}
