//! `fcache cache {status,drop,sync,destroy} NAME`: a request to a running cache's owner, sent
//! without attaching (no process slot, no mapping), so asking never starts an owner or keeps
//! a cache alive.

use super::runtime::{Paths, shared_error};
use super::wire::{Conn, Msg, kind};
use crate::error::Error;

/// What is asked of a shared cache's owner (see [`cache_command`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheCommand {
    /// What the cache holds, as JSON: size, free, dirty, writeback, attached processes, files
    /// and their resident ranges (first page, pages).
    Status,
    /// Drops every clean page (dirty pages and pages in use stay), like `drop_caches`: the
    /// answer says `dropped BUSY` in pages.
    Drop,
    /// Writes every dirty page back.
    Sync,
    /// Writes every dirty page back, then stops the owner, which frees the mapping once no
    /// process holds it. Refused while processes are attached unless `force`.
    Destroy {
        /// Stop even with processes attached (they see the cache gone at their next request).
        force: bool,
    },
}

/// Sends `command` to the owner of shared cache `name` and returns its answer as text (JSON for
/// [`CacheCommand::Status`]). A cache no owner runs is an error naming it.
pub fn cache_command(name: &str, command: CacheCommand) -> Result<String, Error> {
    let paths = Paths::of(name)?;
    let conn = Conn::connect(&paths.sock).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            shared_error(name, "no such shared cache runs (no owner answers)")
        }
        _ => shared_error(name, format!("cannot reach the owner: {e}")),
    })?;
    let msg = match command {
        CacheCommand::Status => Msg::new(kind::STATUS, &[]),
        CacheCommand::Drop => Msg::new(kind::DROP, &[]),
        CacheCommand::Sync => Msg::new(kind::SYNC, &[]),
        CacheCommand::Destroy { force } => Msg::new(kind::DESTROY, &[u64::from(force)]),
    };
    let (answer, _) = conn
        .call(&msg, None)
        .map_err(|e| shared_error(name, e.to_string()))?;
    Ok(match command {
        CacheCommand::Status => answer.text,
        CacheCommand::Drop => format!(
            "dropped {} pages ({} busy or dirty pages kept)",
            answer.word(0).unwrap_or(0),
            answer.word(1).unwrap_or(0)
        ),
        CacheCommand::Sync => "every dirty page written back".to_owned(),
        CacheCommand::Destroy { .. } => {
            "written back; the owner stops and the memory is freed once no process holds it"
                .to_owned()
        }
    })
}
