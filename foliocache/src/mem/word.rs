//! A word that lives either in its owner or in a shared cache's mapping.
//!
//! Some words of a file are read by every process of a shared cache (its index root, its size):
//! there they live in the file's record in the mapping. In a private cache they live in the
//! structure itself. [`Word`] is either, behind one `Deref`.

use std::any::Any;
use std::ptr::NonNull;
use std::sync::Arc;

/// A value held here, or at an address in memory that `keep` keeps mapped.
pub(crate) enum Word<T: 'static> {
    /// Held in the structure.
    Own(T),
    /// In a shared mapping.
    #[cfg(not(loom))]
    At {
        ptr: NonNull<T>,
        _keep: Arc<dyn Any + Send + Sync>,
    },
}

impl<T: 'static> Word<T> {
    /// A word at `ptr`.
    ///
    /// # Safety
    /// `ptr` must point to a valid `T` that stays valid, and is only ever accessed through
    /// shared references (`T` is an atomic), for as long as `keep` lives.
    #[cfg(not(loom))]
    pub(crate) unsafe fn at(ptr: NonNull<T>, keep: Arc<dyn Any + Send + Sync>) -> Self {
        Self::At { ptr, _keep: keep }
    }
}

impl<T: 'static> std::ops::Deref for Word<T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        match self {
            Self::Own(value) => value,
            // SAFETY: per `Word::at`'s contract the pointee is valid while `_keep` lives, which
            // it does as long as `self`.
            #[cfg(not(loom))]
            Self::At { ptr, .. } => unsafe { ptr.as_ref() },
        }
    }
}

impl<T: std::fmt::Debug + 'static> std::fmt::Debug for Word<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

// SAFETY: a `Word` gives only shared access to a `T` that is `Sync` (an atomic); the pointer
// form is memory kept alive by `keep`, which is `Send + Sync`.
unsafe impl<T: Sync + 'static> Send for Word<T> {}
// SAFETY: as above.
unsafe impl<T: Sync + 'static> Sync for Word<T> {}
