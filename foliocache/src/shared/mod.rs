//! The shared mode of the cache: one page cache for every process that attaches to it by name
//! (`docs/SHARED.md`). One process, the owner, changes the cache; the others, clients, read
//! their hits from the mapping themselves and ask the owner for everything else.
//!
//! * `runtime`: where a cache's socket, lock and log live; finding and starting the owner.
//! * `wire`: the control socket (attach, open, the rare operations; deaths are seen on it).
//! * `mailbox`: a client thread's requests through its slot in the mapping, with futexes.
//! * `client`: a process attached to a cache, and its files.
//! * `settings`: the settings a cache is created with.
//!
//! The owner's side is in `crate::owner`, above the cache it runs.

pub(crate) mod admin;
pub(crate) mod client;
pub(crate) mod mailbox;
pub(crate) mod runtime;
pub(crate) mod settings;
pub(crate) mod wire;
