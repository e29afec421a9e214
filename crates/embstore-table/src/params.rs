//! Named parameters of the optimizers and initializers: one table per family (kind name →
//! parameter names with defaults), read by `Optimizer::from_params` / `Initializer::from_params`
//! and written by their `params()`.

use crate::{Error, Result};

/// Each kind's parameters, in order, with their defaults.
pub(crate) type Kinds = [(&'static str, &'static [(&'static str, f32)])];

/// The parameters of kind `name` (empty for an unknown kind).
pub(crate) fn of(kinds: &Kinds, name: &str) -> &'static [(&'static str, f32)] {
    kinds.iter().find(|(n, _)| *n == name).map_or(&[], |(_, p)| p)
}

/// The values of kind `name`'s parameters, in order: `get`'s, or the defaults. `what` names the
/// family in messages ("optimizer"); `given` lists the names the caller passed, each of which
/// must be a parameter of the kind.
pub(crate) fn resolve(
    what: &str,
    kinds: &Kinds,
    name: &str,
    given: &[&str],
    get: impl Fn(&str) -> Option<f32>,
) -> Result<Vec<f32>> {
    let Some((_, params)) = kinds.iter().find(|(n, _)| *n == name) else {
        let names: Vec<&str> = kinds.iter().map(|(n, _)| *n).collect();
        return Err(Error::invalid(format!("unknown {what} {name:?}; expected one of {names:?}")));
    };
    if let Some(bad) = given.iter().find(|g| !params.iter().any(|(p, _)| p == *g)) {
        return Err(Error::invalid(format!(
            "{name} has no parameter {bad:?}; its parameters are {:?}",
            params.iter().map(|(p, _)| *p).collect::<Vec<_>>()
        )));
    }
    Ok(params.iter().map(|&(p, default)| get(p).unwrap_or(default)).collect())
}

/// `values` named by kind `name`'s parameters.
pub(crate) fn named(kinds: &Kinds, name: &str, values: Vec<f32>) -> Vec<(&'static str, f32)> {
    of(kinds, name).iter().map(|(n, _)| *n).zip(values).collect()
}
