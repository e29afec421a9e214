//! Where the rows live: the masters a parameter server reads from and adds deltas to.

use std::sync::Arc;

use embstore_common::{Error, Result};
use embstore_table::{OnMiss, Optimizer, Table};

/// The master copies of a parameter server's tables. Reads return rows in the order asked
/// (a row never written reads as its initial value); `add` adds deltas to rows.
pub trait Masters: Send + Sync {
    /// Values per row of table `table`.
    fn dim(&self, table: usize) -> usize;
    /// The tables' names, in order.
    fn names(&self) -> Vec<String>;
    /// Reads the rows of `keys` into `out` (`[keys, dim]`, row-major), in order.
    fn read(&self, table: usize, keys: &[u64], out: &mut [f32]) -> Result<()>;
    /// Adds `deltas` (`[keys, dim]`) to the rows of `keys` (distinct keys).
    fn add(&self, table: usize, keys: &[u64], deltas: &[f32]) -> Result<()>;

    /// Processes the rows are spread over (1: every row is here).
    fn processes(&self) -> usize {
        1
    }

    /// The process holding the master of `key` of `table`.
    fn owner(&self, _table: usize, _key: u64) -> usize {
        0
    }

    /// Reads as [`Masters::read`] does and says which clock the rows reflect, when the masters
    /// know it (rows spread over processes: every clock up to the one returned is applied);
    /// `None`: the caller's count of pushed clocks holds.
    fn read_at(&self, table: usize, keys: &[u64], out: &mut [f32]) -> Result<Option<i64>> {
        self.read(table, keys, out).map(|()| None)
    }

    /// A read of `keys` (all held by `owner`) encoded once, to be sent again every clock.
    fn prepare(&self, table: usize, owner: usize, keys: &[u64]) -> Prepared {
        Prepared { table, owner, keys: keys.to_vec(), frame: Vec::new() }
    }

    /// Runs a prepared read: the rows, in its keys' order, straight into `out`.
    fn read_prepared(&self, p: &Prepared, out: &mut [f32]) -> Result<Option<i64>> {
        self.read_at(p.table, &p.keys, out)
    }

    /// Adds clock `clock`'s deltas. Rows spread over processes: staged at their owners until
    /// [`Masters::barrier`] applies the clock everywhere.
    fn add_at(&self, _clock: u32, table: usize, keys: &[u64], deltas: &[f32]) -> Result<()> {
        self.add(table, keys, deltas)
    }

    /// Returns once every process has pushed `clock` and every owner applied it.
    fn barrier(&self, _clock: u32) -> Result<()> {
        Ok(())
    }

    /// Places each row of `rows` (per table, the rows this process's workers access) on a
    /// process that accesses it, moving the rows that exist; every process calls it together.
    /// Returns the rows this process moved away. One process: nothing to place.
    fn place(&self, _rows: &[Vec<u64>]) -> Result<u64> {
        Ok(0)
    }

    /// The rows of `keys` that exist (keys, `[rows, dim]` values); nothing is changed.
    fn existing(&self, table: usize, keys: &[u64]) -> Result<(Vec<u64>, Vec<f32>)> {
        let _ = (table, keys);
        Err(embstore_common::Error::new(
            embstore_common::ErrorKind::Unsupported,
            "these masters cannot hand rows over",
        ))
    }

    /// Removes the rows of `keys` (once another process holds them).
    fn remove(&self, table: usize, keys: &[u64]) -> Result<()> {
        let _ = (table, keys);
        Err(embstore_common::Error::new(
            embstore_common::ErrorKind::Unsupported,
            "these masters cannot hand rows over",
        ))
    }

    /// Sets the rows of `keys` to `values`.
    fn assign(&self, table: usize, keys: &[u64], values: &[f32]) -> Result<()> {
        let _ = (table, keys, values);
        Err(embstore_common::Error::new(
            embstore_common::ErrorKind::Unsupported,
            "these masters cannot take rows over",
        ))
    }
}

/// A read encoded once (see [`Masters::prepare`]).
#[derive(Clone, Debug, Default)]
pub struct Prepared {
    /// The table.
    pub table: usize,
    /// The process asked.
    pub owner: usize,
    /// The keys, in the order the rows come back.
    pub keys: Vec<u64>,
    /// The request as sent on the wire (empty for a local read).
    pub frame: Vec<u8>,
}

/// Masters over a store's tables, each of which must add its updates (`Optimizer::Delta`).
pub struct TableMasters {
    tables: Vec<Arc<Table>>,
}

impl std::fmt::Debug for TableMasters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableMasters").field("tables", &self.names()).finish()
    }
}

impl TableMasters {
    /// Masters over `tables`; fails on a table whose optimizer is not `delta`, or on none.
    pub fn new(tables: Vec<Arc<Table>>) -> Result<Self> {
        if tables.is_empty() {
            return Err(Error::invalid("a parameter server needs at least one table"));
        }
        for t in &tables {
            let opt = t.config().optimizer;
            if opt != Optimizer::Delta {
                return Err(Error::invalid(format!(
                    "table {:?} uses {}; a parameter server's updates are deltas that must \
                     commute: create the table with optimizer=delta (embstore.Delta())",
                    t.name(),
                    opt.name()
                )));
            }
        }
        let mut names: Vec<&str> = tables.iter().map(|t| t.name()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::invalid(format!("table {:?} is named twice", w[0])));
        }
        Ok(Self { tables })
    }
}

impl Masters for TableMasters {
    fn dim(&self, table: usize) -> usize {
        self.tables[table].dim()
    }

    fn names(&self) -> Vec<String> {
        self.tables.iter().map(|t| t.name().to_string()).collect()
    }

    fn read(&self, table: usize, keys: &[u64], out: &mut [f32]) -> Result<()> {
        self.tables[table].lookup(keys, OnMiss::Init, out, None)
    }

    fn add(&self, table: usize, keys: &[u64], deltas: &[f32]) -> Result<()> {
        self.tables[table].apply_gradients(keys, deltas, None).map(|_| ())
    }

    fn existing(&self, table: usize, keys: &[u64]) -> Result<(Vec<u64>, Vec<f32>)> {
        let t = &self.tables[table];
        let d = t.dim();
        let mut values = vec![0.0f32; keys.len() * d];
        let mut found = vec![false; keys.len()];
        t.lookup(keys, OnMiss::Zeros, &mut values, Some(&mut found))?;
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        for (i, k) in keys.iter().enumerate().filter(|(i, _)| found[*i]) {
            ks.push(*k);
            vs.extend_from_slice(&values[i * d..(i + 1) * d]);
        }
        Ok((ks, vs))
    }

    fn remove(&self, table: usize, keys: &[u64]) -> Result<()> {
        self.tables[table].remove(keys).map(|_| ())
    }

    fn assign(&self, table: usize, keys: &[u64], values: &[f32]) -> Result<()> {
        self.tables[table].assign(keys, values)
    }
}
