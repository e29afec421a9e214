//! A rollback's side of a table that trains (Ekko Fig 5, steps ① and ④): its writes are
//! refused with [`ErrorKind::RollingBack`] while [`Table::pause_writes`] holds them, and
//! [`Table::rollback_write`] writes a witness's diff through the pause, each row with a fresh
//! version of this table's clock (so above every version written before), for sync to carry
//! to every replica.

use crate::{Error, ErrorKind, Result, Table};

impl Table {
    /// Refuses this table's writes (`assign`, `import`, `remove`, `apply_gradients`, `clear`)
    /// with [`ErrorKind::RollingBack`] and `reason` in the message, or (`None`) takes them
    /// again. Syncing (pulls, and replies applied from peers) goes on.
    pub fn pause_writes(&self, reason: Option<&str>) {
        *self.paused.write() = reason.map(str::to_owned);
    }

    /// Why the table's writes are refused, if they are.
    pub fn writes_paused(&self) -> Option<String> {
        self.paused.read().clone()
    }

    /// `RollingBack` while writes are paused.
    pub(crate) fn check_writable(&self) -> Result<()> {
        match &*self.paused.read() {
            None => Ok(()),
            Some(why) => Err(Error::new(
                ErrorKind::RollingBack,
                format!(
                    "table '{}' takes no writes now: {why}; retry once the rollback has ended",
                    self.name()
                ),
            )),
        }
    }

    /// Writes a rollback's rows through a pause: `values[i]` the row of `ids[i]`, or `None` to
    /// remove it. Each write takes a fresh version. Returns the rows written and removed.
    pub fn rollback_write(&self, ids: &[u64], values: &[Option<Vec<f32>>]) -> Result<usize> {
        self.check_live()?;
        if ids.len() != values.len() {
            return Err(Error::shape(format!(
                "a rollback of {} ids carries {} rows",
                ids.len(),
                values.len()
            )));
        }
        let d = self.dim();
        let (mut set, mut flat, mut gone) = (Vec::new(), Vec::new(), Vec::new());
        for (&k, v) in ids.iter().zip(values) {
            match v {
                Some(v) if v.len() == d => {
                    set.push(k);
                    flat.extend_from_slice(v);
                }
                Some(v) => {
                    return Err(Error::shape(format!(
                        "a rollback row for key {k} holds {} values; the table's dim is {d}",
                        v.len()
                    )))
                }
                None => gone.push(k),
            }
        }
        self.check_finite(&set, &flat, crate::write::StateIn::Keep)?;
        self.assign_rows(&set, &flat)?;
        self.remove_rows(&gone)?;
        Ok(set.len() + gone.len())
    }
}
