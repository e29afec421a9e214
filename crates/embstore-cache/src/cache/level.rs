//! One level of the cache (L1 or L2): a policy's slots holding coded rows and table tags.

use super::key::{key_from_policy, policy_key, table_of, Key};
use super::{CacheConfig, LevelConfig};
use crate::codec::{Codec, CodecKind};
use crate::{Error, Result};
use embstore_policy::Policy;

/// Bytes of the table tag of each slot of a level: none for one table (nothing to tell apart),
/// 1 for up to 256 tables, else 2. In an array of their own: beside a 64-byte row a tag would
/// make every row straddle two cache lines, while the dense array of 1 B tags stays cached.
fn tag_bytes(num_tables: usize) -> usize {
    match num_tables {
        0 | 1 => 0,
        2..=256 => 1,
        _ => 2,
    }
}

/// Entries of a level with `bytes` for rows of `row` bytes and ~`meta` bytes of metadata each.
pub(super) fn entries_for(bytes: f64, row: usize, meta: usize) -> usize {
    (bytes / (row + meta) as f64).floor().max(0.0) as usize
}

pub(super) struct Level {
    pub(super) codec: &'static dyn Codec,
    pub(super) policy: Box<dyn Policy>,
    /// Slot `i`'s row: `code` bytes at `i * code`.
    rows: Vec<u8>,
    /// Slot `i`'s key's table: `tag` bytes at `i * tag` ([`tag_bytes`]; the policy knows
    /// only [`policy_key`]).
    tags: Vec<u8>,
    code: usize,
    tag: usize,
}

impl Level {
    pub(super) fn new(
        cfg: &CacheConfig,
        level: usize,
        codec: CodecKind,
        capacity: usize,
    ) -> Result<Self> {
        let codec = codec.codec();
        let (code, tag) = (codec.bytes_per_row(cfg.dim), tag_bytes(cfg.num_tables));
        let policy = cfg.policy_of(level).build(capacity)?;
        if !policy.has_slots() {
            return Err(Error::invalid(format!(
                "policy {} has no stable slots to hold rows (ev-arc keeps ghost entries): \
                 use it with evaluate() only",
                policy.name()
            )));
        }
        let (rows, tags) = (vec![0u8; capacity * code], vec![0u8; capacity * tag]);
        Ok(Self { codec, policy, rows, tags, code, tag })
    }

    /// A level of `lc`'s codec holding as many entries as fit `share` bytes, metadata
    /// included. InvalidArgument when that is fewer than one request's keys (the tables).
    pub(super) fn sized(
        cfg: &CacheConfig,
        level: usize,
        lc: &LevelConfig,
        share: f64,
    ) -> Result<Self> {
        let row = lc.codec.codec().bytes_per_row(cfg.dim);
        // Size with an estimate of the metadata, measure the real figure at that capacity
        // (the index is a power of two), size again with it, then shrink until the measured
        // bytes fit the share.
        let mut cap = entries_for(share, row, 32).max(1);
        if let Ok(probe) = cfg.policy_of(level).build(cap) {
            let meta = probe.metadata_bytes().div_ceil(cap) + tag_bytes(cfg.num_tables);
            cap = entries_for(share, row, meta);
        }
        loop {
            if cap < cfg.num_tables.max(1) {
                return Err(Error::invalid(format!(
                    "memory budget {} B gives the {} tier {cap} entries per shard, fewer than \
                     one request's {} keys: raise the budget or use fewer shards",
                    cfg.memory_budget_bytes,
                    lc.codec.name(),
                    cfg.num_tables
                )));
            }
            let made = Level::new(cfg, level, lc.codec, cap)?;
            if made.bytes() as f64 <= share {
                return Ok(made);
            }
            cap = ((cap as f64) * 0.99) as usize;
        }
    }

    pub(super) fn bytes(&self) -> usize {
        self.rows.len() + self.metadata_bytes()
    }

    /// Bytes of the rows proper.
    pub(super) fn row_bytes(&self) -> usize {
        self.rows.len()
    }

    /// The policy's bytes and the slots' tags.
    pub(super) fn metadata_bytes(&self) -> usize {
        self.policy.metadata_bytes() + self.tags.len()
    }

    /// The table of the key in `slot`.
    #[inline]
    pub(super) fn tag_of(&self, slot: u32) -> u16 {
        let s = slot as usize * self.tag;
        match self.tag {
            0 => 0,
            1 => u16::from(self.tags[s]),
            _ => u16::from_le_bytes([self.tags[s], self.tags[s + 1]]),
        }
    }

    /// The slot holding `key` (its policy key resident, with `key`'s table).
    #[inline]
    pub(super) fn slot_of(&self, key: Key) -> Option<u32> {
        self.slot_of_pk(policy_key(key), table_of(key))
    }

    /// The slot holding the key of table `table` with policy key `pk`.
    #[inline]
    pub(super) fn slot_of_pk(&self, pk: u64, table: u16) -> Option<u32> {
        self.policy.slot_of(pk).filter(|&s| self.tag_of(s) == table)
    }

    /// The key held in `slot`, whose policy key is `pk`.
    #[inline]
    pub(super) fn key_in(&self, slot: u32, pk: u64) -> Key {
        key_from_policy(self.tag_of(slot), pk)
    }

    pub(super) fn row(&self, slot: u32) -> &[u8] {
        let s = slot as usize * self.code;
        &self.rows[s..s + self.code]
    }

    /// Gives `slot` the tag of `key`.
    pub(super) fn set_tag(&mut self, slot: u32, key: Key) {
        let s = slot as usize * self.tag;
        // The table is below the cache's table count (checked at lookup), so it fits the tag.
        let t = table_of(key).to_le_bytes();
        self.tags[s..s + self.tag].copy_from_slice(&t[..self.tag]);
    }

    /// Writes `key`'s row into `slot`.
    pub(super) fn write(&mut self, slot: u32, key: Key, row: &[f32]) {
        let s = slot as usize * self.code;
        self.codec.encode(row, &mut self.rows[s..s + self.code]);
        self.set_tag(slot, key);
    }

    /// Writes `key`'s row already in this level's code (`code` bytes).
    pub(super) fn write_coded(&mut self, slot: u32, key: Key, coded: &[u8]) {
        let s = slot as usize * self.code;
        self.rows[s..s + self.code].copy_from_slice(coded);
        self.set_tag(slot, key);
    }

    /// Decodes `key`'s row into `out` if resident.
    pub(super) fn get(&self, key: Key, out: &mut [f32]) -> bool {
        self.get_pk(policy_key(key), table_of(key), out)
    }

    /// [`get`](Self::get) for the key of table `table` with policy key `pk`.
    #[inline]
    pub(super) fn get_pk(&self, pk: u64, table: u16, out: &mut [f32]) -> bool {
        match self.slot_of_pk(pk, table) {
            Some(slot) => {
                self.codec.decode(self.row(slot), out);
                true
            }
            None => false,
        }
    }
}
