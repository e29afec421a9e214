//! # embstore-ps
//!
//! A parameter server that learns its workload, after IterStore (Cui et al., SoCC '14).
//! Iterative training touches the same rows in the same order every iteration; each worker
//! announces its accesses once, in a *virtual iteration* that reads and writes nothing (or
//! while its first real iteration runs), and the server builds, before the real run:
//!
//! - a **static store**: the process's rows in one contiguous arena ordered by first read,
//!   found through an immutable NeighborHash (no locks, no map growth);
//! - a **bulk prefetch**: the rows a clock needs are read from the masters in two requests per
//!   table (the early rows first), in arena order, straight into the arena;
//! - **static thread caches**: each worker buffers its updates in a dense buffer over the rows
//!   it updates (the contention rule first, then by access frequency, up to a capacity);
//! - placement of each row on a process that uses it (one process: nothing to place).
//!
//! Rows outside the plan still work (a concurrent map, counted as overflow); past 10 % of a
//! clock's accesses two clocks running the server warns, and with `Replan::Auto` gathers the
//! next clock and rebuilds the plan at the boundary after it.
//!
//! Consistency: BSP (a read in clock `c` reflects every update of clocks `< c`) or SSP with a
//! slack. Every read also reflects the reading worker's own updates. Updates are pushed at
//! clock boundaries in (clock, worker) order, so every variant computes the same values.
//!
//! ```
//! use std::sync::Arc;
//! use embstore_ps::{Options, Ps, TableMasters};
//! use embstore_table::{Optimizer, Table, TableConfig, Initializer};
//!
//! let cfg = TableConfig::new("counts", 1)
//!     .with_optimizer(Optimizer::Delta)
//!     .with_initializer(Initializer::Zeros);
//! let masters = TableMasters::new(vec![Arc::new(Table::new(cfg).unwrap())]).unwrap();
//! let ps = Ps::new(Arc::new(masters), 1, Options::default()).unwrap();
//! let w = ps.worker(0).unwrap();
//! ps.start_gather(true).unwrap();                  // a virtual iteration: logged only
//! w.read(0, &[7], &mut [0.0]).unwrap();
//! w.update(0, &[7], &[1.0]).unwrap();
//! w.clock().unwrap();
//! let plan = ps.finish_gather().unwrap();
//! assert_eq!(plan.rows, 1);
//! for c in 1..=3 {
//!     let mut v = [0.0];
//!     w.read(0, &[7], &mut v).unwrap();
//!     assert_eq!(v[0], (c - 1) as f32);                // every earlier clock's update
//!     w.update(0, &[7], &[1.0]).unwrap();
//!     w.clock().unwrap();
//! }
//! ```

mod cache;
mod cluster;
mod config;
mod masters;
mod plan;
mod ps;

pub use cluster::{Cluster, ClusterMasters};
pub use config::{Consistency, Options, Replan};
pub use masters::{Masters, Prepared, TableMasters};
pub use plan::{Log, Op, PlanStats};
pub use ps::{Ps, Stats, Worker};
