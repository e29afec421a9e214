//! Where a follower writes the rows it pulls: the [`Target`] trait, implemented here by a
//! [`Store`] and by the serving crate's `Server` (the versions it loads with sync on), so that
//! the follower (`embstore-sync`) needs neither the server nor a store of its own.

use std::sync::Arc;

use super::SyncOptions;
use crate::{Error, ErrorKind, Result, Store, Table, TableConfig};

/// A table a sync source offers (the sync port's WELCOME lists them).
#[derive(Clone, Debug, PartialEq)]
pub struct TableInfo {
    pub name: String,
    /// [`TableConfig::to_text`].
    pub config: String,
    pub parts: u32,
    pub epoch: u64,
}

/// Where a follower writes the rows it pulls: a [`Store`]'s tables, or the versions a serving
/// server loaded with sync on, newest first, so that a roll onto a new base continues syncing
/// on top of it.
pub trait Target: Send + Sync {
    /// The replica id written copies carry (never the source's).
    fn replica(&self) -> u32;
    /// Readies the tables the source serves (a store creates those it lacks, with the
    /// source's config, and turns sync on with the source's part counts).
    fn prepare(&self, source: &str, infos: &[TableInfo], sync: &SyncOptions) -> Result<()>;
    /// The table rows of `name` go into now; `None`: none yet (the follower waits).
    fn table(&self, name: &str) -> Option<Arc<Table>>;
}

impl Target for Store {
    fn replica(&self) -> u32 {
        Store::replica(self)
    }

    fn prepare(&self, source: &str, infos: &[TableInfo], sync: &SyncOptions) -> Result<()> {
        let mut tables = Vec::new();
        for info in infos {
            let config = TableConfig::from_text(&info.config)?;
            let t = match Store::table(self, &info.name) {
                Ok(t) => {
                    check_same(&t, &config)?;
                    t
                }
                Err(e) if e.kind() == ErrorKind::TableNotFound => self.create_table(config)?,
                Err(e) => return Err(e),
            };
            tables.push((t, info.parts));
        }
        let parts = tables.iter().map(|(_, p)| *p).max().unwrap_or(1);
        let sync = self.sync_options().unwrap_or(SyncOptions {
            parts,
            knowledge_from_rows: false,
            ..sync.clone()
        });
        self.enable_sync(&sync)?;
        for (t, p) in &tables {
            check_parts(t, *p, source)?;
        }
        if let Some((bucket_ms, dir)) = self.witness_settings() {
            for (t, _) in &tables {
                if !t.witnesses() {
                    t.witness_start(bucket_ms, dir.as_deref())?;
                }
            }
        }
        Ok(())
    }

    fn table(&self, name: &str) -> Option<Arc<Table>> {
        Store::table(self, name).ok()
    }
}

/// Refuses a table whose sync part count differs from the source's (`source` names it).
pub fn check_parts(t: &Table, parts: u32, source: &str) -> Result<()> {
    if t.sync_parts()? != parts {
        return Err(Error::invalid(format!(
            "table '{}' has {} sync parts here and {parts} at {source}: peers must agree",
            t.name(),
            t.sync_parts()?
        )));
    }
    Ok(())
}

fn check_same(t: &Table, source: &TableConfig) -> Result<()> {
    let mine = t.config();
    if mine.embedding_dim != source.embedding_dim
        || mine.optimizer.name() != source.optimizer.name()
        || mine.num_shards != source.num_shards
    {
        return Err(Error::invalid(format!(
            "table '{}' here (dim {}, {}, {} shards) differs from the source's (dim {}, {}, {} \
             shards)",
            t.name(),
            mine.embedding_dim,
            mine.optimizer.name(),
            mine.num_shards,
            source.embedding_dim,
            source.optimizer.name(),
            source.num_shards
        )));
    }
    Ok(())
}
