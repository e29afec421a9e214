//! Helpers shared by the sync integration tests.

use embstore_table::{RowMeta, Table};

/// Every row of `t` (key, values, metadata), in key order.
pub fn rows(t: &Table) -> Vec<(u64, Vec<f32>, RowMeta)> {
    let d = t.dim();
    let mut out: Vec<_> = t
        .export(1 << 20)
        .flat_map(|c| {
            (0..c.len())
                .map(|i| (c.ids[i], c.values[i * d..][..d].to_vec(), c.meta[i]))
                .collect::<Vec<_>>()
        })
        .collect();
    out.sort_by_key(|r| r.0);
    out
}
