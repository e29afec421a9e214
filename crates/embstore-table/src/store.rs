//! [`Store`]: named tables in one process.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::config::validate_name;
use crate::version::Clock;
use crate::{file, Error, ErrorKind, Result, Table, TableConfig, MAX_REPLICA};

/// Named embedding tables held in memory. Cheap to share (`Arc<Table>` per table); every method
/// takes `&self`.
#[derive(Debug)]
pub struct Store {
    tables: RwLock<BTreeMap<String, Arc<Table>>>,
    clock: Arc<Clock>,
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

impl Store {
    /// An empty store; its rows' versions carry replica id 0.
    pub fn new() -> Self {
        Self { tables: RwLock::new(BTreeMap::new()), clock: Arc::new(Clock::new(0)) }
    }

    /// An empty store whose rows' versions carry `replica` (at most [`MAX_REPLICA`]).
    pub fn with_replica(replica: u32) -> Result<Self> {
        if replica > MAX_REPLICA {
            return Err(Error::invalid(format!(
                "replica_id must be in 0..=2^31 - 1, got {replica}"
            )));
        }
        Ok(Self { tables: RwLock::new(BTreeMap::new()), clock: Arc::new(Clock::new(replica)) })
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
        let table = self.tables.write().remove(name).ok_or_else(|| not_found(name))?;
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
        tables.insert(table.name().to_owned(), table.clone());
        Ok(table)
    }
}

fn not_found(name: &str) -> Error {
    Error::new(ErrorKind::TableNotFound, format!("no table named '{name}'"))
}
