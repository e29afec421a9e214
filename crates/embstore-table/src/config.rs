//! A table's configuration, and its text form: the `key=value` lines of [`config_text`] that a
//! table file's header and a store's manifest hold, read back strictly by [`parse_config_text`].

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

/// How a table stores its row values in memory. Lookups, exports and gradients are f32
/// whatever the dtype; optimizer state is always f32.
///
/// With a 16-bit dtype each value is rounded to the nearest representable one (ties to even)
/// when it is written — an initial value, an optimizer step computed in f32, an import — so
/// every value read back is exactly a value of the dtype. A value past the dtype's largest
/// finite one (±65504 for `F16`) is stored as that one, never as an infinity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// 4 bytes per value (the default).
    #[default]
    F32,
    /// bfloat16: 2 bytes, f32's range with 8 bits of precision.
    Bf16,
    /// IEEE half precision: 2 bytes, 11 bits of precision, magnitudes up to 65504.
    F16,
}

impl Dtype {
    /// Bytes per stored value.
    pub fn bytes(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 | Dtype::F16 => 2,
        }
    }

    /// The dtype's name: `fp32`, `bf16` or `fp16`.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "fp32",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "fp16",
        }
    }

    /// The dtype called `name` (`fp32`/`float32`/`f32`, `bf16`/`bfloat16`, `fp16`/`float16`/
    /// `f16`/`half`); an [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)
    /// listing the accepted names otherwise.
    pub fn from_name(name: &str) -> Result<Self> {
        match name.to_ascii_lowercase().as_str() {
            "fp32" | "float32" | "f32" | "float" => Ok(Dtype::F32),
            "bf16" | "bfloat16" => Ok(Dtype::Bf16),
            "fp16" | "float16" | "f16" | "half" => Ok(Dtype::F16),
            _ => {
                Err(Error::invalid(format!("dtype must be 'fp32', 'bf16' or 'fp16', got {name:?}")))
            }
        }
    }

    /// `x` rounded to the nearest value of the dtype (ties to even), as an f32.
    #[inline]
    pub fn round(self, x: f32) -> f32 {
        match self {
            Dtype::F32 => x,
            Dtype::Bf16 => bf16_to_f32(f32_to_bf16(x)),
            Dtype::F16 => f16_to_f32(f32_to_f16(x)),
        }
    }

    /// Rounds every value of `xs` in place (see [`Dtype::round`]), as a table stores them
    /// (for f16 through the same slice conversion).
    pub fn round_slice(self, xs: &mut [f32]) {
        match self {
            Dtype::F32 => {}
            Dtype::Bf16 => xs.iter_mut().for_each(|x| *x = self.round(*x)),
            Dtype::F16 => {
                let mut bits = [0u16; 256];
                for chunk in xs.chunks_mut(bits.len()) {
                    let bits = &mut bits[..chunk.len()];
                    f32_to_f16_slice(chunk, bits);
                    f16_to_f32_slice(bits, chunk);
                }
            }
        }
    }
}

/// `src` as IEEE half bits in `dst` (same length), rounded to nearest, ties to even,
/// saturating at ±65504: the slice conversion of `half`, which uses the CPU's F16C
/// instructions where it has them (detected once per call, not per value).
#[inline]
pub(crate) fn f32_to_f16_slice(src: &[f32], dst: &mut [u16]) {
    use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
    dst.reinterpret_cast_mut::<half::f16>().convert_from_f32_slice(src);
    // Past 65520 a value rounds to infinity; saturate instead (its bits minus one are ±65504:
    // the same as clamping before rounding, since 65504..65520 rounds to 65504). Rows are
    // finite, so no NaN reaches here.
    for d in dst.iter_mut() {
        if *d & 0x7fff == 0x7c00 {
            *d -= 1;
        }
    }
}

/// The f32s of IEEE half bits (exact), as [`f32_to_f16_slice`] converts.
#[inline]
pub(crate) fn f16_to_f32_slice(src: &[u16], dst: &mut [f32]) {
    use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
    src.reinterpret_cast::<half::f16>().convert_to_f32_slice(dst);
}

/// `x` as bfloat16 bits, rounded to nearest, ties to even (a NaN stays a quiet NaN).
#[inline]
pub(crate) fn f32_to_bf16(x: f32) -> u16 {
    // bf16's largest finite value: rounding past it saturates instead of reaching infinity.
    const MAX: f32 = f32::from_bits(0x7f7f_0000);
    if x.is_nan() {
        return ((x.to_bits() >> 16) | 0x0040) as u16;
    }
    let b = x.clamp(-MAX, MAX).to_bits();
    // Adding 0x7fff plus the lowest kept bit rounds half-way cases to the even neighbour; a
    // carry into the exponent is the correct rounding up.
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// The f32 of bfloat16 bits (exact).
#[inline]
pub(crate) fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// `x` as IEEE half bits, rounded to nearest, ties to even, saturating at ±65504.
#[inline]
pub(crate) fn f32_to_f16(x: f32) -> u16 {
    const MAX: f32 = 65504.0;
    half::f16::from_f32(x.clamp(-MAX, MAX)).to_bits()
}

/// The f32 of IEEE half bits (exact).
#[inline]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
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
    /// How row values are stored in memory (optimizer state is always f32).
    pub dtype: Dtype,
}

impl TableConfig {
    /// A config with the defaults: normal(0, 0.01) init, SGD(lr 0.01), 8 shards, seed 0, no
    /// admission, no expiry, non-finite gradients rejected, huge pages on, f32 rows.
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
            dtype: Dtype::F32,
        }
    }

    /// Sets the storage dtype of the row values.
    pub fn with_dtype(mut self, dtype: Dtype) -> Self {
        self.dtype = dtype;
        self
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

impl TableConfig {
    /// The config as `key=value` lines (the form a table file's header and a store's manifest
    /// hold), for handing a table's definition to another process.
    pub fn to_text(&self) -> String {
        config_text(self, 0)
    }

    /// Reads [`TableConfig::to_text`] back strictly; a defect is an
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) naming it.
    pub fn from_text(text: &str) -> Result<Self> {
        let bad = |m: &str| Error::invalid(format!("bad table config: {m}"));
        parse_config_text(text, &bad).map(|(c, _)| c)
    }
}

/// A table's config and step as `key=value` lines: the header of a table file, and the config
/// a store's manifest keeps for each table.
pub(crate) fn config_text(c: &TableConfig, step: u64) -> String {
    let ttl = c.ttl.map_or("none".to_owned(), |d| d.as_millis().to_string());
    // Written only for a 16-bit table: an f32 table's text is as it always was (and readers
    // that predate the key take a file without it as f32, which it is).
    let dtype = match c.dtype {
        Dtype::F32 => String::new(),
        d => format!("dtype={}\n", d.name()),
    };
    let non_finite = match c.non_finite {
        NonFinite::Reject => "reject",
        NonFinite::Skip => "skip",
    };
    format!(
        "name={}\nembedding_dim={}\nnum_shards={}\nseed={}\ninitializer={}\noptimizer={}\n\
         admission_min_count={}\nadmission_sketch_width={}\nttl_ms={ttl}\nnon_finite={non_finite}\n\
         huge_pages={}\n{dtype}step={}\n",
        c.name,
        c.embedding_dim,
        c.num_shards,
        c.seed,
        spec(c.initializer.name(), &c.initializer.params()),
        spec(c.optimizer.name(), &c.optimizer.params()),
        c.admission_min_count,
        c.admission_sketch_width,
        c.huge_pages,
        step,
    )
}

/// `name key=value ...`, each value the shortest decimal that reads back as the same f32.
fn spec(name: &str, params: &[(&str, f32)]) -> String {
    let mut out = name.to_owned();
    for (key, value) in params {
        out.push_str(&format!(" {key}={value:?}"));
    }
    out
}

/// Parses a [`spec`] (or the positional form `name v1 v2 ...` of files written before the
/// parameters were named) with `build` (`Optimizer::from_params` or `Initializer::from_params`).
fn parse_spec<T>(
    text: &str,
    build: impl Fn(&str, &[&str], &dyn Fn(&str) -> Option<f32>) -> Result<T>,
    names: impl Fn(&T) -> Vec<(&'static str, f32)>,
) -> Option<T> {
    let mut words = text.split_whitespace();
    let name = words.next()?;
    let words: Vec<&str> = words.collect();
    let mut given: Vec<(&str, f32)> = Vec::new();
    if words.iter().all(|w| w.contains('=')) {
        for w in &words {
            let (k, v) = w.split_once('=')?;
            if given.iter().any(|(g, _)| *g == k) {
                return None;
            }
            given.push((k, v.parse().ok()?));
        }
    } else {
        // Positional: the parameters in their defined order, all of them.
        let order = names(&build(name, &[], &|_| None).ok()?);
        if order.len() != words.len() {
            return None;
        }
        for ((k, _), w) in order.iter().zip(&words) {
            given.push((k, w.parse().ok()?));
        }
    }
    let keys: Vec<&str> = given.iter().map(|(k, _)| *k).collect();
    let value = |k: &str| given.iter().find(|(g, _)| *g == k).map(|(_, v)| *v);
    let built = build(name, &keys, &value).ok()?;
    // Every parameter must be present: a missing one is not silently defaulted.
    (names(&built).len() == given.len()).then_some(built)
}

/// Reads [`config_text`] back strictly (every key present once, integers of their own type);
/// `bad` makes the error for a defect.
pub(crate) fn parse_config_text(
    text: &str,
    bad: &dyn Fn(&str) -> Error,
) -> Result<(TableConfig, u64)> {
    let mut fields: Vec<(&str, &str)> = Vec::new();
    for line in text.lines() {
        let (key, value) = line.split_once('=').ok_or_else(|| bad("header line without '='"))?;
        if fields.iter().any(|(k, _)| *k == key) {
            return Err(bad(&format!("{key} given twice")));
        }
        fields.push((key, value));
    }
    let field = |key: &str| {
        fields
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
            .ok_or_else(|| bad(&format!("missing {key}")))
    };
    // Each integer is parsed as its own type: a value that does not fit is an error, never a
    // truncation.
    fn int<T: std::str::FromStr>(v: &str, key: &str, bad: &dyn Fn(&str) -> Error) -> Result<T> {
        v.parse::<T>().map_err(|_| bad(&format!("bad {key}: {v:?}")))
    }
    let b = bad;
    let config = TableConfig {
        name: field("name")?.to_owned(),
        embedding_dim: int(field("embedding_dim")?, "embedding_dim", b)?,
        num_shards: int(field("num_shards")?, "num_shards", b)?,
        seed: int(field("seed")?, "seed", b)?,
        initializer: parse_spec(
            field("initializer")?,
            |n, g, f| Initializer::from_params(n, g, f),
            Initializer::params,
        )
        .ok_or_else(|| bad("bad initializer"))?,
        optimizer: parse_spec(
            field("optimizer")?,
            |n, g, f| Optimizer::from_params(n, g, f),
            Optimizer::params,
        )
        .ok_or_else(|| bad("bad optimizer"))?,
        admission_min_count: int(field("admission_min_count")?, "admission_min_count", b)?,
        admission_sketch_width: int(field("admission_sketch_width")?, "admission_sketch_width", b)?,
        ttl: match field("ttl_ms")? {
            "none" => None,
            v => Some(Duration::from_millis(int(v, "ttl_ms", b)?)),
        },
        non_finite: match field("non_finite")? {
            "reject" => NonFinite::Reject,
            "skip" => NonFinite::Skip,
            v => return Err(bad(&format!("bad non_finite: {v:?}"))),
        },
        huge_pages: match field("huge_pages")? {
            "true" => true,
            "false" => false,
            v => return Err(bad(&format!("bad huge_pages: {v:?}"))),
        },
        // Absent in the text of an f32 table (and of every table written before dtypes).
        dtype: match fields.iter().find(|(k, _)| *k == "dtype").map(|(_, v)| *v) {
            None | Some("fp32") => Dtype::F32,
            Some("bf16") => Dtype::Bf16,
            Some("fp16") => Dtype::F16,
            Some(v) => return Err(bad(&format!("bad dtype: {v:?}"))),
        },
    };
    let step = int(field("step")?, "step", b)?;
    // Keys from later versions are ignored.
    config.validate().map_err(|e| bad(e.message()))?;
    Ok((config, step))
}
