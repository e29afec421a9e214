//! [`Store`]: named tables in one process, held in memory or in a directory (`durable`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::config::validate_name;
use crate::disk::vfs::{RealFs, Vfs};
use crate::durable::{Durable, FlushStats, RecoveryReport};
use crate::version::Clock;
use crate::{file, Error, ErrorKind, Result, Table, TableConfig, MAX_REPLICA};

/// Named embedding tables. Held in memory ([`Store::new`]) or kept in a directory
/// ([`Store::open`]), where [`Store::flush`] makes every write so far durable. Cheap to share
/// (`Arc<Table>` per table); every method takes `&self`.
#[derive(Debug)]
pub struct Store {
    tables: RwLock<BTreeMap<String, Arc<Table>>>,
    clock: Arc<Clock>,
    durable: Option<Durable>,
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

impl Store {
    /// An empty store; its rows' versions carry replica id 0.
    pub fn new() -> Self {
        Self { tables: RwLock::new(BTreeMap::new()), clock: Arc::new(Clock::new(0)), durable: None }
    }

    /// An empty store whose rows' versions carry `replica` (at most [`MAX_REPLICA`]).
    pub fn with_replica(replica: u32) -> Result<Self> {
        Ok(Self { clock: Arc::new(Clock::new(check_replica(replica)?)), ..Self::new() })
    }

    /// Opens the store kept in `dir`, creating it (and `dir`) if there is none, and rebuilds
    /// its tables from the last flush. The directory stays locked until the store is dropped:
    /// a second open fails with [`ErrorKind::Locked`].
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(dir, 0, Arc::new(RealFs))
    }

    /// [`Store::open`] with a replica id and a file layer (a fault-injecting one in tests).
    pub fn open_with(dir: impl AsRef<Path>, replica: u32, vfs: Arc<dyn Vfs>) -> Result<Self> {
        let clock = Arc::new(Clock::new(check_replica(replica)?));
        let (durable, tables) = Durable::open(dir.as_ref(), vfs, &clock)?;
        let tables = tables.into_iter().map(|t| (t.name().to_owned(), t)).collect();
        Ok(Self { tables: RwLock::new(tables), clock, durable: Some(durable) })
    }

    /// The directory of a store opened with [`Store::open`]; `None` for one in memory.
    pub fn path(&self) -> Option<&Path> {
        self.durable.as_ref().map(|d| d.dir())
    }

    /// What [`Store::open`] found and repaired; `None` for a store in memory.
    pub fn recovery(&self) -> Option<&RecoveryReport> {
        self.durable.as_ref().map(|d| &d.report)
    }

    /// Makes every write acknowledged before this call durable (see `durable` for exactly what
    /// that means); a no-op for a store in memory. On an error (a full disk:
    /// [`ErrorKind::NoSpace`]) nothing is lost: the rows stay in memory, marked to be written,
    /// and the next flush writes them.
    pub fn flush(&self) -> Result<FlushStats> {
        let Some(durable) = &self.durable else { return Ok(FlushStats::default()) };
        durable.flush(&self.all_tables())
    }

    /// Creates a table; fails if the name is taken or the config is invalid.
    pub fn create_table(&self, config: TableConfig) -> Result<Arc<Table>> {
        let mut tables = self.tables.write();
        if tables.contains_key(&config.name) {
            return Err(Error::new(
                ErrorKind::TableExists,
                format!("table '{}' already exists", config.name),
            ));
        }
        let table = Arc::new(Table::with_clock(config, self.clock.clone())?);
        if let Some(durable) = &self.durable {
            durable.create_table(&table)?;
        }
        tables.insert(table.name().to_owned(), table.clone());
        Ok(table)
    }

    /// The table called `name`.
    pub fn table(&self, name: &str) -> Result<Arc<Table>> {
        self.tables.read().get(name).cloned().ok_or_else(|| not_found(name))
    }

    /// The names of all tables, sorted.
    pub fn tables(&self) -> Vec<String> {
        self.tables.read().keys().cloned().collect()
    }

    /// Removes the table called `name`. Handles still held fail with `TableNotFound` from then
    /// on; the memory is freed once the last one is dropped.
    pub fn drop_table(&self, name: &str) -> Result<()> {
        let mut tables = self.tables.write();
        if !tables.contains_key(name) {
            return Err(not_found(name));
        }
        if let Some(durable) = &self.durable {
            durable.drop_table(name)?;
        }
        let table = tables.remove(name).ok_or_else(|| not_found(name))?;
        table.mark_dropped();
        Ok(())
    }

    /// Creates a table from a file written by [`Table::save`], named as in the file or `name`.
    /// The table joins the store only once the whole file has loaded.
    pub fn load_table(&self, path: impl AsRef<Path>, name: Option<&str>) -> Result<Arc<Table>> {
        let path = path.as_ref();
        let mut config = file::read_config(path)?;
        if let Some(name) = name {
            validate_name(name)?;
            config.name = name.to_owned();
        }
        let exists = |name: &str| {
            Error::new(ErrorKind::TableExists, format!("table '{name}' already exists"))
        };
        if self.tables.read().contains_key(&config.name) {
            return Err(exists(&config.name));
        }
        let table = Arc::new(Table::with_clock(config, self.clock.clone())?);
        table.load(path)?;
        let mut tables = self.tables.write();
        if tables.contains_key(table.name()) {
            return Err(exists(table.name()));
        }
        if let Some(durable) = &self.durable {
            durable.create_table(&table)?;
        }
        tables.insert(table.name().to_owned(), table.clone());
        Ok(table)
    }
}

impl Store {
    pub(crate) fn durable(&self) -> Option<&Durable> {
        self.durable.as_ref()
    }

    pub(crate) fn clock(&self) -> &Arc<Clock> {
        &self.clock
    }

    pub(crate) fn all_tables(&self) -> Vec<Arc<Table>> {
        self.tables.read().values().cloned().collect()
    }

    /// Adds a table built elsewhere (`restore`); its rows are written by the next flush.
    pub(crate) fn adopt_table(&self, table: Arc<Table>) -> Result<()> {
        let mut tables = self.tables.write();
        if tables.contains_key(table.name()) {
            return Err(Error::new(
                ErrorKind::TableExists,
                format!("table '{}' already exists", table.name()),
            ));
        }
        if let Some(durable) = &self.durable {
            durable.create_table(&table)?;
        }
        tables.insert(table.name().to_owned(), table);
        Ok(())
    }
}

fn check_replica(replica: u32) -> Result<u32> {
    if replica > MAX_REPLICA {
        return Err(Error::invalid(format!("replica_id must be in 0..=2^31 - 1, got {replica}")));
    }
    Ok(replica)
}

fn not_found(name: &str) -> Error {
    Error::new(ErrorKind::TableNotFound, format!("no table named '{name}'"))
}
