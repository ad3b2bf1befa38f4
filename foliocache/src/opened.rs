//! Files as their users hold them: [`Opened`] (shared by every clone of a
//! [`File`](crate::File); the last one to go writes the file back) and the cache's
//! [`FileTable`] of shared files, one per device and inode. Above writeback, which the last
//! holder runs.

use crate::error::Error;
use crate::inode::Inode;
use crate::writeback::{SyncMode, write_back};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// The files a cache has open from storage, by device and inode number: opening a file that is
/// already open gives the same [`File`](crate::File), so everyone who opens it shares one
/// cache of it, as the kernel keeps one page cache per inode.
///
/// An entry keeps the file's inode too (weakly): while the last holder's drop writes the file
/// back, the inode is still alive, and an open in that window shares it (a new [`Opened`] of
/// the same inode) instead of reading storage behind the write back's back.
#[derive(Debug, Default)]
pub(crate) struct FileTable {
    files: Mutex<HashMap<(u64, u64), Entry>>,
}

/// A file table's entry: the shared file, and its inode (alive a little longer, see above).
type Entry = (Weak<Opened>, Weak<Inode>);

impl FileTable {
    /// The open file with this identity, or the one `open` makes (registered here). The table
    /// is locked meanwhile, so two openers of one new file get one file.
    pub(crate) fn get_or_open(
        self: &Arc<Self>,
        key: (u64, u64),
        open: impl FnOnce() -> Result<Arc<Inode>, Error>,
    ) -> Result<(Arc<Opened>, bool), Error> {
        let _order = crate::sync::order::taking(crate::sync::order::Rank::FileTable);
        let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        let (inode, created) = match files.get(&key) {
            Some((opened, inode)) => {
                if let Some(opened) = opened.upgrade() {
                    return Ok((opened, false));
                }
                // The last holder is letting go (writing back): share its inode.
                match inode.upgrade() {
                    Some(inode) => (inode, false),
                    None => (open()?, true),
                }
            }
            None => (open()?, true),
        };
        let opened = Arc::new(Opened {
            inode,
            table: Some((Arc::clone(self), key)),
        });
        files.insert(
            key,
            (Arc::downgrade(&opened), Arc::downgrade(&opened.inode)),
        );
        Ok((opened, created))
    }

    /// Forgets `key` if its file is gone (called as the file drops).
    fn forget(&self, key: (u64, u64)) {
        let _order = crate::sync::order::taking(crate::sync::order::Rank::FileTable);
        let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        if files
            .get(&key)
            .is_some_and(|(opened, _)| opened.strong_count() == 0)
        {
            files.remove(&key);
        }
    }
}

/// A file as its users hold it (every [`File`](crate::File) clone shares one): when the last
/// one lets go, the file's dirty data is written back and waited for (the cache is private, so
/// nobody else could write it later), and a shared file leaves its cache's file table. Write
/// errors there have nobody left to report to; a user who cares syncs before letting go.
#[derive(Debug)]
pub(crate) struct Opened {
    pub(crate) inode: Arc<Inode>,
    /// Where a shared file is registered in its cache's file table.
    table: Option<(Arc<FileTable>, (u64, u64))>,
}

impl Opened {
    /// A file not in any table (a memory file, a file opened apart, a custom backend).
    pub(crate) fn apart(inode: Arc<Inode>) -> Arc<Self> {
        Arc::new(Self { inode, table: None })
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        // Write back what is dirty and wait, including for a flusher's pass still under way
        // (its writes may be done while it has yet to set the size on storage exactly): the
        // pass lock waits for it.
        if self.inode.writable().is_ok() {
            let _ = write_back(&self.inode, 0, u64::MAX, SyncMode::All);
        }
        if let Some((table, key)) = &self.table {
            table.forget(*key);
        }
    }
}
