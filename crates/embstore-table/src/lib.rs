//! # embstore-table: embedding tables
//!
//! Rows of `embedding_dim` f32 values keyed by raw u64 feature ids (no vocabulary to build),
//! trained in place by server-side sparse optimizers.
//!
//! ## Parts
//! - [`Store`] — named [`Table`]s in one process (`store`).
//! - [`Table`] — `num_shards` shards behind their own reader-writer locks (`table`). Each
//!   shard (`shard`) is a NeighborHash index from id to a slot in two row arenas (`arena`:
//!   values and optimizer state, grown gradually, huge pages once a chunk reaches 2 MiB) with
//!   16-byte packed metadata per slot (`meta`) and a free list; sparse shards shrink.
//! - Batch calls group ids by shard (`batch`) and run the shards on the caller plus a small
//!   pool (`sched`): [`Table::lookup`] with [`OnMiss`] and [`Table::contains`] (`lookup`),
//!   [`Table::apply_gradients`] (`apply`), [`Table::assign`], [`Table::import`],
//!   [`Table::remove`] (`write`), [`Table::export`] (`export`), [`Table::save`]/[`Table::load`]
//!   (`file`), [`Table::evict_expired`], [`Table::stats`] and [`Table::index_stats`] (`stats`).
//! - Under a memory budget ([`Budget`], `budget`: the store-wide bytes and the evictor thread,
//!   reaching tables only through the `Reclaim` trait) a durable store's tables grow larger
//!   than memory: the memory tier (`tier`: the gate, fault-in, reclaim, pins) is a layer under
//!   the table, over each shard's cold side (`shard/cold`: cold index, disk locations, file
//!   slots); cold reads are planned (`disk/plan`) for the I/O engine (`disk/io`).
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

mod apply;
mod arena;
mod batch;
mod budget;
mod checkpoint;
mod config;
mod counters;
pub mod disk;
mod durable;
mod error;
mod export;
mod init;
mod inspect;
mod lookup;
mod meta;
mod optim;
mod params;
mod priority;
mod sched;
mod shard;
mod sketch;
mod stats;
mod store;
pub mod sync;
mod table;
mod tier;
mod values;
mod version;
mod witness;
mod write;

pub use budget::Budget;
pub use checkpoint::open_checkpoint_shard;
pub use config::{
    validate_name as validate_table_name, Dtype, NonFinite, TableConfig, MAX_EMBEDDING_DIM,
    MAX_SHARDS,
};
pub use durable::checkpoint::{
    checkpoint_table_bytes, load_checkpoint_shard, load_checkpoint_shard_as, CheckpointReport,
};
pub use durable::{FlushStats, RecoveryReport, COMPACT_MIN_RECORDS};
/// Which rows the memory tier evicts ([`StoreOptions::eviction`]); the policies live in
/// `embstore-policy` (the store and the inference cache share them).
pub use embstore_policy::EvictionConfig;
pub use error::{Error, ErrorKind, Result};
pub use export::{Export, RowChunk};
pub use init::Initializer;
pub use inspect::{inspect, verify, StoreReport, TableReport};
pub use lookup::OnMiss;
pub use meta::{RowMeta, MAX_REPLICA};
pub use optim::{Optimizer, Step};
pub use sched::threads;
pub use stats::{IndexStats, TableStats};
pub use store::{Store, StoreOptions};
pub use table::{shard_of_key, Table};
pub use version::{now_ms, Version};
