//! A model of one file's page versions, for stress tests with concurrent readers and one
//! writer: every change gives each page it touches a new version (a sequence number and what
//! the page then holds), and a reader checks that each page it read holds, whole, one version
//! that was the page's current one at some moment during its read.
//!
//! The writer announces a change before making it (`begin`: the version is added to the
//! page's history and becomes *pending*) and confirms it after (`end`: it becomes *current*).
//! A reader notes each page's current version before reading (`before`) and compares each
//! page's bytes with the versions from that one up to the page's pending one after the read:
//! those are exactly the versions the page may have held during the read. A stale page (a
//! version older than the current one at the start), a torn page (two versions mixed), or
//! another page's or file's bytes all fail.
//!
//! Page bytes: a data version is the 16-byte word `(file << 48 | page, data generation)`
//! repeated over the page, optionally with one zeroed byte range (a partial hole punch or the
//! tail past a truncation); a hole is all zeros.

#![allow(dead_code)]

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

pub const PAGE: usize = 4096;

/// What a page holds in one version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    /// All zeros.
    Zero,
    /// The stamp of data generation `generation`, with `zero` (a byte range of the page)
    /// zeroed.
    Stamp {
        generation: u64,
        zero: Option<(usize, usize)>,
    },
}

/// The stamp of `file`'s page `page` in data generation `generation`, as page bytes.
pub fn stamp(file: u64, page: u64, generation: u64) -> Vec<u8> {
    let word = (file << 48 | page).to_le_bytes();
    let generation = generation.to_le_bytes();
    let mut bytes = Vec::with_capacity(PAGE);
    while bytes.len() < PAGE {
        bytes.extend_from_slice(&word);
        bytes.extend_from_slice(&generation);
    }
    bytes
}

/// The page bytes of `content` for `file`'s page `page`.
pub fn expected(file: u64, page: u64, content: Content) -> Vec<u8> {
    match content {
        Content::Zero => vec![0; PAGE],
        Content::Stamp { generation, zero } => {
            let mut bytes = stamp(file, page, generation);
            if let Some((from, to)) = zero {
                bytes[from..to].fill(0);
            }
            bytes
        }
    }
}

struct Page {
    current: AtomicU64,
    pending: AtomicU64,
    /// (sequence, content, cancelled): append-only, in sequence order.
    history: Mutex<Vec<(u64, Content, bool)>>,
}

/// The versions of every page of one file.
pub struct Versions {
    file: u64,
    pages: Vec<Page>,
    next: AtomicU64,
    /// What the writer knows each page holds now (the writer's own bookkeeping).
    now: Mutex<Vec<Content>>,
}

impl Versions {
    /// `pages` pages of `file`, all holding `initial` (as version 0).
    pub fn new(file: u64, pages: u64, initial: Content) -> Self {
        Self {
            file,
            pages: (0..pages)
                .map(|_| Page {
                    current: AtomicU64::new(0),
                    pending: AtomicU64::new(0),
                    history: Mutex::new(vec![(0, initial, false)]),
                })
                .collect(),
            next: AtomicU64::new(1),
            now: Mutex::new(vec![initial; pages as usize]),
        }
    }

    pub fn file(&self) -> u64 {
        self.file
    }

    /// What page `page` holds now (for the writer, which changes it).
    pub fn content(&self, page: u64) -> Content {
        self.now
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)[page as usize]
    }

    /// A fresh data generation (unique across the file's changes).
    pub fn generation(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Announces that `page` is about to hold `content`; returns the version's sequence.
    pub fn begin(&self, page: u64, content: Content) -> u64 {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let entry = &self.pages[page as usize];
        entry
            .history
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((seq, content, false));
        entry.pending.store(seq, Ordering::SeqCst);
        seq
    }

    /// Confirms a change announced by `begin` (the file now holds it).
    pub fn end(&self, page: u64, seq: u64) {
        let entry = &self.pages[page as usize];
        let content = {
            let history = entry
                .history
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            history.iter().rev().find(|e| e.0 == seq).unwrap().1
        };
        self.now
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)[page as usize] = content;
        entry.current.store(seq, Ordering::SeqCst);
    }

    /// Withdraws a change announced by `begin` that did not happen (the file was unchanged).
    pub fn cancel(&self, page: u64, seq: u64) {
        let entry = &self.pages[page as usize];
        let mut history = entry
            .history
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(e) = history.iter_mut().rev().find(|e| e.0 == seq) {
            e.2 = true;
        }
        let current = entry.current.load(Ordering::SeqCst);
        entry.pending.store(current, Ordering::SeqCst);
    }

    /// Before a read of pages `first..=last`: their current versions.
    pub fn before(&self, first: u64, last: u64) -> Vec<u64> {
        (first..=last.min(self.pages.len() as u64 - 1))
            .map(|p| self.pages[p as usize].current.load(Ordering::SeqCst))
            .collect()
    }

    /// After a read of `buf` at byte `pos` (whose `before` was taken): every page's bytes are
    /// one version that was current at some moment of the read. Panics with the details
    /// otherwise.
    pub fn check(&self, pos: u64, buf: &[u8], before: &[u64]) {
        let first = pos / PAGE as u64;
        let mut at = 0usize;
        while at < buf.len() {
            let byte = pos + at as u64;
            let page = byte / PAGE as u64;
            let offset = (byte % PAGE as u64) as usize;
            let n = (PAGE - offset).min(buf.len() - at);
            let got = &buf[at..at + n];
            let lo = before[(page - first) as usize];
            let entry = &self.pages[page as usize];
            let hi = entry.pending.load(Ordering::SeqCst);
            let history = entry
                .history
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let fits = history
                .iter()
                .filter(|(seq, _, cancelled)| !cancelled && *seq >= lo && *seq <= hi)
                .any(|(_, content, _)| {
                    expected(self.file, page, *content)[offset..offset + n] == *got
                });
            if !fits {
                let candidates: Vec<_> = history
                    .iter()
                    .filter(|(seq, _, _)| *seq >= lo && *seq <= hi)
                    .collect();
                panic!(
                    "file {} page {page} bytes {offset}..{}: not one version current during the \
                     read (versions {lo}..={hi}: {candidates:?}); first words read: {:?}",
                    self.file,
                    offset + n,
                    &got[..got.len().min(32)]
                );
            }
            at += n;
        }
    }
}
