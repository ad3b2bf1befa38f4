//! foliocache in front of object storage.
//!
//! An object (`s3://bucket/key`, through the `object_store` crate's S3 client) becomes a file
//! of a foliocache [`Cache`]: the kernel-grade readahead (ondemand windows, the async part,
//! large folios, batched insertion) turns a sequential reader's misses into a few large
//! ranged GETs in flight ahead of it, a random read costs one GET of its folio, and a second
//! read is a copy out of memory.
//!
//! - [`ObjectCache::open_object`]: `cache.open_object("s3://bucket/key")`, then
//!   [`ObjectFile::handle`] and [`ObjectHandle::read_at`] (blocking) or
//!   [`ObjectHandle::read_at_async`] (a future that does not block a thread on a miss).
//! - [`CachedStore`]: an [`object_store::ObjectStore`] that reads through the cache, for
//!   programs that read through that trait (the `parquet` crate's async reader, DataFusion).
//!
//! - Writes: open with [`ObjectOptions::write`] (or `create`), then [`ObjectFile::write_at`]
//!   and [`ObjectFile::sync`]. Writes go into the cache as dirty folios; a sync uploads the
//!   new object with a conditional PUT, so another writer's version is never silently
//!   overwritten ([`commit`]).
//!
//! Objects are served by private caches only (a shared cache's owner would need the store's
//! endpoint and credentials, which are the client's): `open_object` on a shared cache is
//! [`Error::Cache`] with `Unsupported`.
//!
//! Versions and failures are described in [`backend`]; the window sizes that keep a reader
//! at the network's rate in `docs/OBJECT.md`.

pub mod backend;
#[cfg(feature = "cluster")]
pub mod cluster;
pub mod commit;
mod file;
mod runtime;
mod store;
mod url;

pub use backend::{ObjectBackend, ObjectOptions, ObjectStats};
pub use file::{CHANGE_RETRIES, ObjectFile, ObjectHandle};
pub use store::CachedStore;
pub use url::ObjectUrl;

use foliocache::Cache;
use object_store::ObjectStore;
use object_store::path::Path;
use std::sync::Arc;

/// What can go wrong opening an object.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A name that is not `s3://bucket/key`.
    #[error("{url}: {reason}")]
    Url {
        /// The name given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The store's client could not be built.
    #[error("{what}: {source}")]
    Store {
        /// What was being built.
        what: String,
        /// Why not.
        #[source]
        source: object_store::Error,
    },
    /// The object could not be looked at (HEAD): missing, refused, unreachable.
    #[error("{url}: {source}")]
    Head {
        /// The object.
        url: String,
        /// Why (its errno: `ENOENT`, `EACCES`, `ETIMEDOUT`, `EIO`).
        #[source]
        source: std::io::Error,
    },
    /// The cache refused the file.
    #[error(transparent)]
    Cache(#[from] foliocache::Error),
}

/// Opening objects in a [`Cache`].
pub trait ObjectCache {
    /// Opens `s3://bucket/key` with the default [`ObjectOptions`] (see [`url`'s
    /// client](ObjectUrl) for how the store is found). One HEAD; reads come later.
    fn open_object(&self, url: &str) -> Result<ObjectFile, Error> {
        self.open_object_with(url, &ObjectOptions::default())
    }

    /// Opens `s3://bucket/key` with `options`.
    fn open_object_with(&self, url: &str, options: &ObjectOptions) -> Result<ObjectFile, Error>;

    /// Opens `path` in any `object_store` store (a store the caller built: another cloud,
    /// an in-memory store in tests).
    fn open_object_in(
        &self,
        store: Arc<dyn ObjectStore>,
        path: &Path,
        options: &ObjectOptions,
    ) -> Result<ObjectFile, Error>;
}

impl ObjectCache for Cache {
    fn open_object_with(&self, url: &str, options: &ObjectOptions) -> Result<ObjectFile, Error> {
        let parsed = ObjectUrl::parse(url)?;
        let link = url::link_for(&parsed.bucket, &options.for_client())?;
        open_linked(self, link, parsed.path(), url, options)
    }

    fn open_object_in(
        &self,
        store: Arc<dyn ObjectStore>,
        path: &Path,
        options: &ObjectOptions,
    ) -> Result<ObjectFile, Error> {
        let name = format!("{store}/{path}");
        let link = backend::StoreLink::new(store, options.for_client());
        open_linked(self, link, path.clone(), &name, options)
    }
}

/// Opens `path` of a linked store, named after its store and path.
pub(crate) fn open_linked_at(
    cache: &Cache,
    link: Arc<backend::StoreLink>,
    path: Path,
) -> Result<ObjectFile, Error> {
    let name = format!("{}/{path}", link.store);
    let options = link.options.clone();
    open_linked(cache, link, path, &name, &options)
}

fn open_linked(
    cache: &Cache,
    link: Arc<backend::StoreLink>,
    path: Path,
    name: &str,
    options: &ObjectOptions,
) -> Result<ObjectFile, Error> {
    if cache.is_shared() {
        return Err(Error::Cache(foliocache::Error::Unsupported {
            what: "an object file",
            mode: "shared",
        }));
    }
    let backend = runtime::wait(ObjectBackend::open(link, path, options.create))
        .map(Arc::new)
        .map_err(|source| Error::Head {
            url: name.to_owned(),
            source,
        })?;
    let file = if options.write || options.create {
        cache.open_writable_backend(
            Arc::clone(&backend) as Arc<dyn foliocache::WriteBackend>,
            None,
        )?
    } else {
        cache.open_backend(Arc::clone(&backend) as Arc<dyn foliocache::Backend>, None)?
    };
    Ok(ObjectFile::new(file, backend))
}
