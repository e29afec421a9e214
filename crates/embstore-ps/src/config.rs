//! How a parameter server runs: its consistency model and which specialisations are on.

use embstore_common::{Error, Result};

/// When a worker's reads must reflect the other workers' updates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consistency {
    /// Bulk synchronous: a read in clock `c` reflects every update of clocks `< c`; a worker's
    /// `clock()` waits until every worker has finished its clock.
    Bsp,
    /// Stale synchronous: a read in clock `c` reflects every update of clocks `< c - slack`;
    /// a worker runs at most `slack` clocks ahead of the slowest.
    Ssp {
        /// Clocks a read may lag behind.
        slack: u32,
    },
}

impl Consistency {
    /// The clocks a read may lag (0 under BSP).
    pub fn slack(&self) -> u32 {
        match self {
            Self::Bsp => 0,
            Self::Ssp { slack } => *slack,
        }
    }
}

/// What happens when accesses outside the plan pass 10 % of a clock's accesses two clocks
/// running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replan {
    /// Count them only.
    Off,
    /// Count them and raise the warning flag (`Stats::overflow_warnings`).
    Warn,
    /// Warn, then gather the next clock's accesses as they happen and rebuild the plan at the
    /// clock boundary after it (BSP only: every worker is at the boundary then).
    Auto,
}

impl Replan {
    /// The names, as the Python API spells them.
    pub const NAMES: [&'static str; 3] = ["off", "warn", "auto"];

    /// The mode called `name`.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "off" => Ok(Self::Off),
            "warn" => Ok(Self::Warn),
            "auto" => Ok(Self::Auto),
            _ => Err(Error::invalid(format!(
                "replan must be one of {:?}, got {name:?}",
                Self::NAMES
            ))),
        }
    }
}

/// The specialisations a plan turns on, and their parameters. [`Options::default`] turns on
/// every one; [`Options::variant`] names the ablations the benchmarks run.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// The consistency model.
    pub consistency: Consistency,
    /// Rows in the plan live in a contiguous arena ordered by first read, found through an
    /// immutable NeighborHash (otherwise: a concurrent map of rows, as a generic PS keeps).
    pub static_store: bool,
    /// The plan's rows are read from the masters in bulk, in arena order, when a clock needs
    /// fresher rows (otherwise: each row is fetched on its first read after it went stale).
    pub prefetch: bool,
    /// Each worker buffers its updates to its planned rows in a static, dense buffer found
    /// through an immutable index (otherwise: a hash map of rows, grown as it goes).
    pub thread_caches: bool,
    /// Each row lives on a process that uses it (one process: nothing to place).
    pub placement: bool,
    /// The share of a worker's reads whose rows the early prefetch covers.
    pub early_ratio: f64,
    /// The contention bound of the static thread caches (IterStore's CPB).
    pub cpb: f64,
    /// Rows a worker's static thread cache holds at most (`None`: every row it updates).
    pub thread_cache_rows: Option<usize>,
    /// What accesses outside the plan trigger.
    pub replan: Replan,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            consistency: Consistency::Bsp,
            static_store: true,
            prefetch: true,
            thread_caches: true,
            placement: true,
            early_ratio: 0.1,
            cpb: 0.05,
            thread_cache_rows: None,
            replan: Replan::Warn,
        }
    }
}

impl Options {
    /// The names of the specialisations, as [`Options::variant`] and the benchmarks spell them.
    pub const SPECIALISATIONS: [&'static str; 4] =
        ["static", "prefetch", "thread-caches", "placement"];

    /// The benchmark variants: `all` (every specialisation), `no-opt` (none), a specialisation's
    /// name (it alone) or `all-but-NAME`.
    pub fn variant(name: &str) -> Result<Self> {
        let set = |on: &dyn Fn(&str) -> bool| Self {
            static_store: on("static"),
            prefetch: on("prefetch"),
            thread_caches: on("thread-caches"),
            placement: on("placement"),
            ..Self::default()
        };
        let known = |s: &str| Self::SPECIALISATIONS.contains(&s);
        match name {
            "all" => Ok(set(&|_| true)),
            "no-opt" => Ok(set(&|_| false)),
            _ if known(name) => Ok(set(&|s| s == name)),
            _ if name.strip_prefix("all-but-").is_some_and(known) => {
                let off = &name["all-but-".len()..];
                Ok(set(&|s| s != off))
            }
            _ => Err(Error::invalid(format!(
                "unknown variant {name:?}: expected all, no-opt, one of {:?} or all-but-<one of them>",
                Self::SPECIALISATIONS
            ))),
        }
    }

    /// Every name [`Options::variant`] accepts, in the order the benchmarks report them.
    pub fn variant_names() -> Vec<String> {
        let mut v = vec!["no-opt".to_string(), "all".to_string()];
        v.extend(Self::SPECIALISATIONS.iter().map(|s| s.to_string()));
        v.extend(Self::SPECIALISATIONS.iter().map(|s| format!("all-but-{s}")));
        v
    }

    /// Checks the parameters.
    pub fn validate(&self) -> Result<()> {
        if !(0.0..=1.0).contains(&self.early_ratio) {
            return Err(Error::invalid(format!(
                "early_ratio must be in [0, 1], got {}",
                self.early_ratio
            )));
        }
        if !(self.cpb.is_finite() && self.cpb > 0.0) {
            return Err(Error::invalid(format!("cpb must be finite and > 0, got {}", self.cpb)));
        }
        Ok(())
    }
}
