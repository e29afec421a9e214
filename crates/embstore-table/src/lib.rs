//! # embstore-table: embedding tables
//!
//! Rows of `embedding_dim` f32 values keyed by raw u64 feature ids (no vocabulary to build),
//! trained in place by server-side sparse optimizers.
//!
//! ## Parts
//! - [`Store`] — named [`Table`]s in one process.
//! - [`Table`] — `num_shards` shards, each a NeighborHash index from id to a slot in a row arena
//!   (fixed stride, free list on delete) behind its own reader-writer lock. Batch calls group
//!   ids by shard and run the shards in parallel: [`Table::lookup`] (with [`OnMiss`]),
//!   [`Table::apply_gradients`], [`Table::assign`], [`Table::remove`], [`Table::contains`],
//!   [`Table::export`]/[`Table::import`], [`Table::save`]/[`Table::load`],
//!   [`Table::evict_expired`], [`Table::stats`].
//! - [`Optimizer`] — SGD, Adagrad, row-wise Adagrad, Adam, FTRL, following torch's formulas.
//! - [`Initializer`] — initial values as a pure function of (seed, key, column), so a row first
//!   touched on any machine gets the same value with no coordination.
//! - Admission — a count-min sketch: with `admission_min_count = n`, an id gets a row on its
//!   n-th lookup; before that lookups return the initial value without storing it.
//! - [`Version`] — Ekko's (hybrid timestamp, replica id) per row, with an update count and the
//!   last-update time ([`RowMeta`]).
//!
//! ## Invariants
//! - A fallible call checks its whole input (shapes, finiteness, lr) before it changes
//!   anything; a rejected call leaves every row as it was.
//! - A row's values, state and metadata change together under its shard's write lock: readers
//!   never see half a step.
//! - Versions written by one store increase strictly.
//!
//! ```
//! use embstore_table::{OnMiss, Optimizer, Store, TableConfig};
//!
//! let store = Store::new();
//! let config = TableConfig::new("user", 4).with_optimizer(Optimizer::Sgd { lr: 0.1 });
//! let table = store.create_table(config)?;
//! let mut rows = vec![0.0; 2 * 4];
//! table.lookup(&[7, 7], OnMiss::Init, &mut rows, None)?;
//! let before = rows[0];
//! table.apply_gradients(&[7, 7], &[1.0; 8], None)?; // duplicates are summed: w -= 0.1 * 2
//! table.lookup(&[7], OnMiss::Error, &mut rows[..4], None)?;
//! assert!((rows[0] - (before - 0.2)).abs() < 1e-6);
//! # Ok::<(), embstore_table::Error>(())
//! ```

mod arena;
mod config;
mod error;
mod file;
mod init;
mod optim;
mod sketch;
mod store;
mod table;
mod version;

pub use config::{NonFinite, TableConfig, MAX_EMBEDDING_DIM, MAX_SHARDS};
pub use error::{Error, ErrorKind, Result};
pub use init::Initializer;
pub use optim::Optimizer;
pub use store::Store;
pub use table::{threads, Export, OnMiss, RowChunk, RowMeta, Table, TableStats};
pub use version::{now_ms, Version};
