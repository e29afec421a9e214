//! What the parameter server's test files share.

use std::sync::Arc;

use embstore_table::{Initializer, Optimizer, Table, TableConfig};

/// Delta tables of `(name, dim)`, rows starting uniform in [-1, 1) (seed 7).
pub fn delta_tables(specs: &[(&str, usize)]) -> Vec<Arc<Table>> {
    specs
        .iter()
        .map(|(name, dim)| {
            let cfg = TableConfig::new(*name, *dim)
                .with_optimizer(Optimizer::Delta)
                .with_initializer(Initializer::Uniform { low: -1.0, high: 1.0 })
                .with_seed(7);
            Arc::new(Table::new(cfg).unwrap())
        })
        .collect()
}
