//! A table's configuration.

use std::time::Duration;

use crate::{Error, Initializer, Optimizer, Result};

/// The largest `embedding_dim`.
pub const MAX_EMBEDDING_DIM: usize = 4096;
/// The most shards a table may have.
pub const MAX_SHARDS: usize = 1024;

/// The longest time-to-live: 100 years.
pub const MAX_TTL: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// What `apply_gradients` does with a NaN or infinite gradient.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NonFinite {
    /// Reject the whole call with [`ErrorKind::NonFinite`](crate::ErrorKind::NonFinite); nothing
    /// changes.
    #[default]
    Reject,
    /// Skip the ids whose summed gradient is not finite; step the others. Counted in
    /// [`TableStats::skipped_non_finite`](crate::TableStats::skipped_non_finite).
    Skip,
}

/// Everything that defines a table. Build with [`TableConfig::new`] and the `with_*` setters.
#[derive(Clone, Debug, PartialEq)]
pub struct TableConfig {
    /// The table's name in its store.
    pub name: String,
    /// Values per row, `1..=4096`.
    pub embedding_dim: usize,
    /// How a new row's values are drawn (a function of `seed` and the key).
    pub initializer: Initializer,
    /// The server-side optimizer `apply_gradients` runs.
    pub optimizer: Optimizer,
    /// Shards (a power of two): each has its own index, arena and lock.
    pub num_shards: usize,
    /// Seed of the initializer.
    pub seed: u64,
    /// A new id gets a row only once it has been looked up this many times (0 or 1: at once).
    pub admission_min_count: u32,
    /// Counters per row of the admission sketch (rounded up to a power of two).
    pub admission_sketch_width: usize,
    /// Rows not updated for this long are removed by `evict_expired`.
    pub ttl: Option<Duration>,
    /// What to do with non-finite gradients.
    pub non_finite: NonFinite,
    /// Back large arenas and indexes with transparent huge pages.
    pub huge_pages: bool,
}

impl TableConfig {
    /// A config with the defaults: normal(0, 0.01) init, SGD(lr 0.01), 8 shards, seed 0, no
    /// admission, no expiry, non-finite gradients rejected, huge pages on.
    pub fn new(name: impl Into<String>, embedding_dim: usize) -> Self {
        Self {
            name: name.into(),
            embedding_dim,
            initializer: Initializer::default(),
            optimizer: Optimizer::default(),
            num_shards: 8,
            seed: 0,
            admission_min_count: 0,
            admission_sketch_width: 1 << 20,
            ttl: None,
            non_finite: NonFinite::Reject,
            huge_pages: true,
        }
    }

    /// Sets the optimizer.
    pub fn with_optimizer(mut self, optimizer: Optimizer) -> Self {
        self.optimizer = optimizer;
        self
    }

    /// Sets the initializer.
    pub fn with_initializer(mut self, initializer: Initializer) -> Self {
        self.initializer = initializer;
        self
    }

    /// Sets the shard count.
    pub fn with_shards(mut self, num_shards: usize) -> Self {
        self.num_shards = num_shards;
        self
    }

    /// Sets the seed.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Checks every field; the message names the field and the value.
    pub fn validate(&self) -> Result<()> {
        validate_name(&self.name)?;
        if !(1..=MAX_EMBEDDING_DIM).contains(&self.embedding_dim) {
            return Err(Error::invalid(format!(
                "embedding_dim must be in 1..={MAX_EMBEDDING_DIM}, got {}",
                self.embedding_dim
            )));
        }
        if !self.num_shards.is_power_of_two() || self.num_shards > MAX_SHARDS {
            return Err(Error::invalid(format!(
                "num_shards must be a power of two in 1..={MAX_SHARDS}, got {}",
                self.num_shards
            )));
        }
        if self.admission_sketch_width > 1 << 28 {
            return Err(Error::invalid(format!(
                "admission_sketch_width must be at most 2^28, got {}",
                self.admission_sketch_width
            )));
        }
        if let Some(ttl) = self.ttl {
            if ttl.is_zero() || ttl > MAX_TTL {
                return Err(Error::invalid(format!(
                    "ttl must be positive and at most 100 years, got {ttl:?}"
                )));
            }
        }
        self.initializer.validate()?;
        self.optimizer.validate()
    }
}

/// Names are 1..=255 bytes with no control characters.
/// Checks a table name: 1..=255 bytes, no control characters (NUL included), no path
/// separators (`/`, `\\`), and not `.` or `..` — names reach file and directory names (a
/// server's shard directories, checkpoints), so no name can ever become a path.
pub fn validate_name(name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 255
        || name.chars().any(|c| c.is_control() || c == '/' || c == '\\')
        || name == "."
        || name == ".."
    {
        return Err(Error::invalid(format!(
            "table name must be 1..=255 bytes without control characters or path separators \
             ('/', '\\'), and not '.' or '..', got {name:?}"
        )));
    }
    Ok(())
}
