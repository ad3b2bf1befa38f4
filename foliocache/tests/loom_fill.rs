//! loom models of a read that misses: readahead inserts a locked folio and submits its read,
//! the backend completes it on another thread (the I/O completion), and the reader waits for
//! the folio's lock and copies only once it is uptodate. Also two readers of the same missing
//! page: one inserts, both get the bytes, the page is read once.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release --test loom_fill`
#![cfg(loom)]

use foliocache::raw;
use foliocache::{Backend, Cache, ReadRequest};
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

/// Completes every read on a new thread, filling each page with `page index + 1`.
#[derive(Debug, Default)]
struct ThreadedBackend {
    reads: AtomicUsize,
    /// The completion threads, joined by the model before it returns (a thread still running
    /// after the model's closure would outlive the execution's statics).
    threads: loom::sync::Mutex<Vec<thread::JoinHandle<()>>>,
}

impl ThreadedBackend {
    fn join_all(&self) {
        let threads = std::mem::take(&mut *self.threads.lock().unwrap());
        for t in threads {
            t.join().unwrap();
        }
    }
}

impl Backend for ThreadedBackend {
    fn size(&self) -> u64 {
        2 * 4096
    }
    fn submit(&self, requests: Vec<ReadRequest>) {
        for mut request in requests {
            self.reads.fetch_add(1, Ordering::Relaxed);
            let t = thread::spawn(move || {
                for (offset, bytes) in request.targets() {
                    bytes.fill((offset / 4096 + 1) as u8);
                }
                let len = request.len();
                request.complete(Ok(len));
            });
            self.threads.lock().unwrap().push(t);
        }
    }
}

fn setup() -> (Cache, foliocache::File, std::sync::Arc<ThreadedBackend>) {
    let cache = Cache::builder()
        .arena_pages(8)
        .max_order(0)
        // Readahead off: a miss reads exactly the page asked for.
        .readahead_bytes(0)
        .build()
        .unwrap();
    let backend = std::sync::Arc::new(ThreadedBackend::default());
    let file = cache.open_backend(backend.clone(), None).unwrap();
    (cache, file, backend)
}

/// The read runs on a thread with room on its stack: the whole read path of a file from
/// storage, with loom's atomics, outgrows the small stack loom gives a model's first thread.
#[test]
fn reader_waits_for_the_completion_and_sees_its_bytes() {
    loom::model(|| {
        thread::Builder::new()
            .stack_size(4 << 20)
            .spawn(|| {
                let (_cache, file, backend) = setup();
                let mut handle = file.handle();
                let mut buf = [0u8; 16];
                assert_eq!(handle.read_at(&mut buf, 4096).unwrap(), 16);
                assert_eq!(buf, [2u8; 16]);
                assert_eq!(backend.reads.load(Ordering::Relaxed), 1);
                backend.join_all();
            })
            .unwrap()
            .join()
            .unwrap();
    });
}

/// Two readers miss the same page at once (the race `filemap_create_folio` and readahead
/// resolve with -EEXIST): each allocates a folio and tries to insert it; exactly one wins and
/// fills it, the other finds the winner's folio, waits for its lock and sees its bytes. (The
/// whole read path with two readers is too large a model to explore; the real-thread test
/// `concurrent_readers_see_the_file_bytes` covers it.)
#[test]
fn two_inserters_of_a_missing_page_one_wins_the_other_waits() {
    loom::model(|| {
        let cache = Cache::builder()
            .arena_pages(4)
            .max_order(0)
            .build()
            .unwrap();
        let mapping = std::sync::Arc::new(raw::new_mapping(&cache));
        let fills = std::sync::Arc::new(AtomicUsize::new(0));
        type Shared = (
            Cache,
            std::sync::Arc<foliocache::raw::Mapping>,
            std::sync::Arc<AtomicUsize>,
        );
        let racer = |(cache, mapping, fills): Shared| {
            move || {
                let folio = foliocache::raw::alloc_folio(&cache, 0).unwrap();
                match mapping.add_folio(folio, 0) {
                    Ok((locked, _)) => {
                        // Inserted locked: this reader fills it (here: nothing to copy) and
                        // ends the read.
                        fills.fetch_add(1, Ordering::Relaxed);
                        locked.end_read(true).id()
                    }
                    Err(foliocache::Error::Exists { .. }) => {
                        let found = mapping.lookup(0).expect("the winner's folio");
                        found.wait_unlocked();
                        assert!(found.is_uptodate());
                        found.id()
                    }
                    Err(other) => panic!("{other}"),
                }
            }
        };
        let other = thread::spawn(racer((cache.clone(), mapping.clone(), fills.clone())));
        let mine = racer((cache.clone(), mapping.clone(), fills.clone()))();
        let theirs = other.join().unwrap();
        assert_eq!(
            mine, theirs,
            "both readers end up with the one cached folio"
        );
        assert_eq!(fills.load(Ordering::Relaxed), 1);
    });
}
