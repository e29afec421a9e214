//! [`Noop`]: the eviction that keeps every row in memory (a store without a memory budget).

use super::Eviction;

/// The policy that keeps everything: `victims` appends nothing; no metadata.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Noop;

impl Eviction for Noop {
    fn on_insert(&mut self, _slot: usize) {}
    fn on_access(&self, _slot: usize) {}
    fn on_remove(&mut self, _slot: usize) {}
    fn on_move(&mut self, _from: usize, _to: usize) {}
    fn victims(&mut self, _n: usize, _pinned: &dyn Fn(usize) -> bool, _out: &mut Vec<usize>) {}
    fn bytes_per_slot(&self) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::never;
    use super::super::EvictionConfig;

    #[test]
    fn noop_keeps_everything() {
        let mut p = EvictionConfig::Noop.build(1);
        for s in 0..10 {
            p.on_insert(s);
            p.on_access(s);
        }
        let mut out = Vec::new();
        p.victims(5, &never, &mut out);
        assert!(out.is_empty());
        assert_eq!(p.bytes_per_slot(), 0);
    }
}
