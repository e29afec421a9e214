//! What an inference cache is built from: its levels, policy, budget shares and L3 feed.

use crate::codec::CodecKind;
use crate::{Error, Result};
use embstore_policy::PolicyConfig;

/// How L3 learns the surrogates of keys evicted from the last level when their table's build is
/// on disk ([`SurrogateTable::Disk`](crate::surrogate::SurrogateTable::Disk); a build in memory
/// is always read inline).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum L3Fill {
    /// A filler thread reads the blocks in batches, off the request path (the paper's I/O
    /// threads); what it found enters L3 at the start of a later lookup, or at
    /// [`InferenceCache::sync_l3`](super::InferenceCache::sync_l3). Keys beyond its bounded
    /// queue are dropped and counted.
    #[default]
    Background,
    /// The commit that evicts a key reads its block (one disk read on the request path):
    /// deterministic, so results equal those of the build held in memory.
    Inline,
}

impl L3Fill {
    /// The names [`L3Fill::parse`] takes.
    pub const NAMES: [&'static str; 2] = ["background", "inline"];

    /// By name (InvalidArgument otherwise).
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "background" => Ok(Self::Background),
            "inline" => Ok(Self::Inline),
            _ => Err(Error::invalid(format!(
                "unknown l3_fill {name:?}; expected one of {:?}",
                Self::NAMES
            ))),
        }
    }
}

/// One level: a codec and its share of the budget.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LevelConfig {
    /// How rows are stored.
    pub codec: CodecKind,
    /// Share of the budget, in (0, 1].
    pub share: f64,
}

/// Everything an [`InferenceCache`](super::InferenceCache) is built from.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheConfig {
    /// Number of tables; a key's table must be below it.
    pub num_tables: usize,
    /// Embedding dimension of every table.
    pub dim: usize,
    /// Bytes for everything: rows, metadata, indexes, L3.
    pub memory_budget_bytes: usize,
    /// The replacement policy of each level (it must keep rows in slots: not EV-ARC).
    pub policy: PolicyConfig,
    /// One or two levels (L1, then L2), in order. Shares sum to at most 1.
    pub levels: Vec<LevelConfig>,
    /// Share of the budget for L3's map when surrogates are given (taken before the levels'
    /// shares are applied to the rest).
    pub surrogate_share: f64,
    /// Most surrogates served in one request.
    pub max_approx_per_request: usize,
    /// Largest stored surrogate distance served (the build's own threshold applies too).
    pub max_surrogate_dist: f32,
    /// Demote L1 victims into L2 (a victim cache; no I/O).
    pub demote: bool,
    /// Shards (each a full L1/L2/L3 with `1/shards` of the budget); 1 = deterministic.
    pub shards: usize,
    /// How L3 is fed from surrogate builds on disk.
    pub l3_fill: L3Fill,
}

impl CacheConfig {
    /// One f32 level, [`GroupAssoc`](crate::GroupAssoc) with `S = num_tables` (more perfect
    /// hits per byte than GroupLfu in every configuration measured: docs/benchmarks.md,
    /// "The inference cache", "The default policy"), 1 shard, no surrogates.
    pub fn new(num_tables: usize, dim: usize, memory_budget_bytes: usize) -> Self {
        Self {
            num_tables,
            dim,
            memory_budget_bytes,
            policy: PolicyConfig::GroupAssoc(crate::GroupAssocConfig {
                max_score: num_tables.clamp(1, 255) as u8,
                ..crate::GroupAssocConfig::default()
            }),
            levels: vec![LevelConfig { codec: CodecKind::F32, share: 1.0 }],
            surrogate_share: 0.04,
            max_approx_per_request: 2,
            max_surrogate_dist: f32::INFINITY,
            demote: true,
            shards: 1,
            l3_fill: L3Fill::Background,
        }
    }

    /// The policy of level `level` (0: L1). An L2 fed by demotion (`demote`) takes
    /// `group_assoc`'s group rule unless a rule is given: its keys come from L1's victims,
    /// not from the requests an adaptive policy's shadows learn from (measured: adapting there
    /// cost 9-13 points of perfect hits on ML11 and the synthetic trace, f32 ¼ + int4 ¾).
    pub(super) fn policy_of(&self, level: usize) -> PolicyConfig {
        match &self.policy {
            PolicyConfig::GroupAssoc(c) if level > 0 && self.demote && c.rule.is_none() => {
                PolicyConfig::GroupAssoc(crate::GroupAssocConfig {
                    rule: Some(crate::policy::Rule::Group),
                    ..c.clone()
                })
            }
            p => p.clone(),
        }
    }

    pub(super) fn validate(&self) -> Result<()> {
        if self.num_tables == 0 || self.num_tables > 1 << 16 {
            return Err(Error::invalid(format!(
                "the cache needs 1 to 65536 tables, got {}",
                self.num_tables
            )));
        }
        if self.dim == 0 {
            return Err(Error::invalid("embedding dim must be at least 1, got 0"));
        }
        if self.levels.is_empty() || self.levels.len() > 2 {
            return Err(Error::invalid(format!(
                "the cache takes 1 or 2 tiers, got {}",
                self.levels.len()
            )));
        }
        let sum: f64 = self.levels.iter().map(|t| t.share).sum();
        for t in &self.levels {
            if !(t.share.is_finite() && t.share > 0.0) {
                return Err(Error::invalid(format!(
                    "tier {} share must be in (0, 1], got {}",
                    t.codec.name(),
                    t.share
                )));
            }
        }
        if sum > 1.0 + 1e-9 {
            return Err(Error::invalid(format!("tier shares must sum to at most 1, got {sum}")));
        }
        if !(0.0..1.0).contains(&self.surrogate_share) {
            return Err(Error::invalid(format!(
                "surrogate share must be in [0, 1), got {}",
                self.surrogate_share
            )));
        }
        if self.max_surrogate_dist.is_nan() || self.max_surrogate_dist < 0.0 {
            return Err(Error::invalid(format!(
                "max surrogate distance must be >= 0, got {}",
                self.max_surrogate_dist
            )));
        }
        if self.shards == 0 || self.shards > 1024 {
            return Err(Error::invalid(format!("shards must be 1 to 1024, got {}", self.shards)));
        }
        Ok(())
    }
}
