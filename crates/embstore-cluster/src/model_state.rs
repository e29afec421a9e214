//! A model's state as a replicated state machine in etcd (spec `ekko.md` §6.2, "State
//! machine"): one JSON record [`ModelState`] at `MODEL + model + "/state"`, written by
//! compare-and-swap only.
//!
//! - The decisions ([`put_state`]) are made at increasing times: a record whose `t_ms` is not
//!   above the stored one is refused, so a stale or repeated decision never overwrites a newer
//!   one.
//! - Each witness's `t_max` ([`record_t_max`]) only rises.
//! - One rollback per model at a time ([`begin_rollback`] / [`end_rollback`]): a flag set by
//!   compare-and-swap, so two managers never both start one.
//!
//! Every change reads the record, changes it and writes it back only if nobody wrote it in
//! between (its etcd revision is unchanged); otherwise it reads again and retries. Each field
//! has one kind of writer, and a writer keeps the fields of the others as it finds them.

use std::collections::BTreeMap;

use embstore_common::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};

use crate::etcd::Etcd;
use crate::health::{Health, Interval};
use crate::MODEL;

/// How many times a change is retried when other writers keep changing the record first.
const MAX_TRIES: usize = 64;

/// A model's replicated state (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelState {
    /// The state the manager last recorded: it changes only on a confident decision.
    pub state: Health,
    /// When that decision was made (event time, ms): rises with every write of [`put_state`].
    pub t_ms: u64,
    /// Each witness's `t_max`: the time up to which its healthy store holds the logs. Only
    /// [`record_t_max`] raises it; [`put_state`] keeps it.
    #[serde(default)]
    pub t_max_ms: BTreeMap<String, u64>,
    /// The model's corrupted intervals, oldest first (the last may be open).
    #[serde(default)]
    pub corrupted: Vec<Interval>,
    /// Whether a rollback is under way: set and cleared only by [`begin_rollback`] and
    /// [`end_rollback`]; [`put_state`] keeps it.
    #[serde(default)]
    pub rolling_back: bool,
    /// The model client traffic goes to instead, while this one is not trusted.
    #[serde(default)]
    pub alternative: Option<String>,
    /// At a healthy decision: the time up to which the model state propagated is healthy
    /// (the window's end less the dissemination latency), what witnesses flush their logs up to.
    #[serde(default)]
    pub t_healthy_ms: Option<u64>,
}

impl ModelState {
    /// The record as stored.
    pub fn to_json(&self) -> Vec<u8> {
        // Strings, integers, booleans and maps keyed by strings always serialize.
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }

    /// A stored record; `Corruption` if it is not one.
    pub fn from_json(key: &str, bytes: &[u8]) -> Result<Self> {
        serde_json::from_slice(bytes).map_err(|e| {
            Error::new(ErrorKind::Corruption, format!("etcd key {key} is not a model state: {e}"))
        })
    }
}

/// The key of `model`'s state; `InvalidArgument` for an empty name or one with a '/'.
fn key(model: &str) -> Result<String> {
    if model.is_empty() || model.contains('/') {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("model name must be non-empty and hold no '/', got '{model}'"),
        ));
    }
    Ok(format!("{MODEL}{model}/state"))
}

/// The error for a change to a model that has no state yet.
fn unknown(model: &str) -> Error {
    Error::new(ErrorKind::UnknownName, format!("no state recorded for model '{model}'"))
}

/// The record at `key` with its revision, if there is one.
async fn read(etcd: &Etcd, key: &str) -> Result<Option<(ModelState, i64)>> {
    match etcd.get(key).await? {
        Some(kv) => Ok(Some((ModelState::from_json(key, &kv.value)?, kv.mod_revision))),
        None => Ok(None),
    }
}

/// What a change does with the record it read.
enum Step<T> {
    /// Write this record, and answer `T` once it is written.
    Write(ModelState, T),
    /// Write nothing, and answer `T`.
    Keep(T),
}

/// Applies `change` to `model`'s record (`None`: there is none) by compare-and-swap, reading
/// again and retrying while another writer got in first; `Unavailable` after [`MAX_TRIES`].
async fn update<T>(
    etcd: &Etcd,
    model: &str,
    mut change: impl FnMut(Option<ModelState>) -> Result<Step<T>>,
) -> Result<T> {
    let key = key(model)?;
    for _ in 0..MAX_TRIES {
        let current = read(etcd, &key).await?;
        let revision = current.as_ref().map_or(0, |(_, r)| *r);
        match change(current.map(|(s, _)| s))? {
            Step::Keep(answer) => return Ok(answer),
            Step::Write(next, answer) => {
                if etcd.put_if(&key, &next.to_json(), revision, 0).await? {
                    return Ok(answer);
                }
            }
        }
    }
    Err(Error::new(
        ErrorKind::Unavailable,
        format!("model '{model}': its state changed under {MAX_TRIES} tries in a row"),
    ))
}

/// `model`'s state, if one was recorded.
pub async fn get_state(etcd: &Etcd, model: &str) -> Result<Option<ModelState>> {
    Ok(read(etcd, &key(model)?).await?.map(|(s, _)| s))
}

/// Records the manager's decision `new` for `model` if its `t_ms` is above the stored one (or
/// nothing is stored); whether it did. An older or equal time is refused with `Ok(false)` and
/// writes nothing. `state`, `t_ms`, `corrupted` and `alternative` are written as given; the
/// witnesses' `t_max_ms` and the `rolling_back` flag are kept as stored (with `new`'s
/// `t_max_ms` entries only where they are higher, for a first record).
pub async fn put_state(etcd: &Etcd, model: &str, new: &ModelState) -> Result<bool> {
    update(etcd, model, |current| {
        let Some(current) = current else {
            return Ok(Step::Write(new.clone(), true));
        };
        if new.t_ms <= current.t_ms {
            return Ok(Step::Keep(false));
        }
        let mut next = new.clone();
        next.rolling_back = current.rolling_back;
        next.t_max_ms = current.t_max_ms;
        for (witness, &t) in &new.t_max_ms {
            let stored = next.t_max_ms.entry(witness.clone()).or_insert(t);
            *stored = (*stored).max(t);
        }
        Ok(Step::Write(next, true))
    })
    .await
}

/// Raises witness `witness`'s `t_max` for `model` to `t_max_ms`; whether it did (`false`: the
/// stored one is as high already, and nothing is written). `UnknownName` if `model` has no
/// state yet, `InvalidArgument` for an empty witness name.
pub async fn record_t_max(etcd: &Etcd, model: &str, witness: &str, t_max_ms: u64) -> Result<bool> {
    if witness.is_empty() {
        return Err(Error::new(ErrorKind::InvalidArgument, "witness name must be non-empty"));
    }
    update(etcd, model, |current| {
        let mut next = current.ok_or_else(|| unknown(model))?;
        if next.t_max_ms.get(witness).is_some_and(|&t| t >= t_max_ms) {
            return Ok(Step::Keep(false));
        }
        next.t_max_ms.insert(witness.to_string(), t_max_ms);
        Ok(Step::Write(next, true))
    })
    .await
}

/// Marks a rollback of `model` as under way. `Locked` if one is already (the caller must not
/// start another), `UnknownName` if `model` has no state yet.
pub async fn begin_rollback(etcd: &Etcd, model: &str) -> Result<()> {
    update(etcd, model, |current| {
        let mut next = current.ok_or_else(|| unknown(model))?;
        if next.rolling_back {
            return Err(Error::new(
                ErrorKind::Locked,
                format!("model '{model}' is rolling back already"),
            ));
        }
        next.rolling_back = true;
        Ok(Step::Write(next, ()))
    })
    .await
}

/// Marks `model`'s rollback as over; whether one was under way (`false`: nothing is written).
/// `UnknownName` if `model` has no state.
pub async fn end_rollback(etcd: &Etcd, model: &str) -> Result<bool> {
    update(etcd, model, |current| {
        let mut next = current.ok_or_else(|| unknown(model))?;
        if !next.rolling_back {
            return Ok(Step::Keep(false));
        }
        next.rolling_back = false;
        Ok(Step::Write(next, true))
    })
    .await
}

/// The models with a recorded state, sorted by name.
pub async fn list_models(etcd: &Etcd) -> Result<Vec<String>> {
    Ok(etcd
        .range_prefix(MODEL)
        .await?
        .into_iter()
        .filter_map(|kv| {
            let name = kv.key.strip_prefix(MODEL)?.strip_suffix("/state")?;
            (!name.is_empty() && !name.contains('/')).then(|| name.to_string())
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TestEtcd;
    use std::sync::Arc;
    use std::time::Duration;

    async fn etcd(server: &TestEtcd) -> Arc<Etcd> {
        Arc::new(
            Etcd::connect(std::slice::from_ref(&server.endpoint), Duration::from_secs(2)).unwrap(),
        )
    }

    fn at(state: Health, t_ms: u64) -> ModelState {
        ModelState { state, t_ms, ..Default::default() }
    }

    #[tokio::test]
    async fn writes_are_monotone_in_time_and_names_are_checked() {
        let server = TestEtcd::start().await.unwrap();
        let etcd = etcd(&server).await;
        assert_eq!(get_state(&etcd, "ctr").await.unwrap(), None);
        assert!(list_models(&etcd).await.unwrap().is_empty());

        assert!(put_state(&etcd, "ctr", &at(Health::Healthy, 10)).await.unwrap());
        assert!(!put_state(&etcd, "ctr", &at(Health::Corrupted, 10)).await.unwrap(), "equal t");
        assert!(!put_state(&etcd, "ctr", &at(Health::Corrupted, 5)).await.unwrap(), "older t");
        assert_eq!(get_state(&etcd, "ctr").await.unwrap(), Some(at(Health::Healthy, 10)));
        let rev = etcd.get("/embstore/model/ctr/state").await.unwrap().unwrap().mod_revision;

        let corrupted = ModelState {
            corrupted: vec![Interval { start_ms: 15, end_ms: None }],
            alternative: Some("ctr-baseline".into()),
            ..at(Health::Corrupted, 20)
        };
        assert!(put_state(&etcd, "ctr", &corrupted).await.unwrap());
        assert_eq!(get_state(&etcd, "ctr").await.unwrap().as_ref(), Some(&corrupted));
        assert!(!put_state(&etcd, "ctr", &at(Health::Healthy, 19)).await.unwrap());
        let kv = etcd.get("/embstore/model/ctr/state").await.unwrap().unwrap();
        assert!(kv.mod_revision > rev);
        let after = kv.mod_revision;
        assert!(!put_state(&etcd, "ctr", &at(Health::Healthy, 20)).await.unwrap());
        let kv = etcd.get("/embstore/model/ctr/state").await.unwrap().unwrap();
        assert_eq!(kv.mod_revision, after, "a refused write wrote");

        // A decision keeps the witnesses' t_max and the rollback flag it finds.
        assert!(record_t_max(&etcd, "ctr", "w1", 7).await.unwrap());
        begin_rollback(&etcd, "ctr").await.unwrap();
        assert!(put_state(&etcd, "ctr", &at(Health::Healthy, 30)).await.unwrap());
        let s = get_state(&etcd, "ctr").await.unwrap().unwrap();
        assert_eq!((s.state, s.t_ms, s.rolling_back), (Health::Healthy, 30, true));
        assert_eq!(s.t_max_ms, BTreeMap::from([("w1".to_string(), 7)]));

        assert!(put_state(&etcd, "adx", &at(Health::Uncertain, 1)).await.unwrap());
        assert_eq!(list_models(&etcd).await.unwrap(), ["adx", "ctr"]);

        for bad in ["", "a/b", "/"] {
            let e = put_state(&etcd, bad, &at(Health::Healthy, 40)).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad:?}");
            assert_eq!(get_state(&etcd, bad).await.unwrap_err().kind(), ErrorKind::InvalidArgument);
        }
        assert_eq!(list_models(&etcd).await.unwrap().len(), 2);

        etcd.put("/embstore/model/bad/state", b"{not json", 0).await.unwrap();
        assert_eq!(get_state(&etcd, "bad").await.unwrap_err().kind(), ErrorKind::Corruption);
        let e = put_state(&etcd, "bad", &at(Health::Healthy, 50)).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corruption);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_writers_one_wins_and_t_max_only_rises() {
        let server = TestEtcd::start().await.unwrap();
        let etcd = etcd(&server).await;
        // Eight writers of the same time: exactly one wins, each round.
        for round in 1..=5u64 {
            let tasks: Vec<_> = (0..8)
                .map(|i| {
                    let (etcd, state) = (etcd.clone(), at(Health::Healthy, round * 100));
                    let state = ModelState { alternative: Some(format!("w{i}")), ..state };
                    tokio::spawn(async move { put_state(&etcd, "m", &state).await.unwrap() })
                })
                .collect();
            let mut wins = 0;
            for t in tasks {
                wins += usize::from(t.await.unwrap());
            }
            assert_eq!(wins, 1, "round {round}");
        }
        // Writers of different times: the latest always wins and stays.
        let tasks: Vec<_> = (0..8u64)
            .map(|i| {
                let etcd = etcd.clone();
                tokio::spawn(async move {
                    put_state(&etcd, "m", &at(Health::Healthy, 1_000 + i)).await.unwrap()
                })
            })
            .collect();
        let mut won = Vec::new();
        for t in tasks {
            won.push(t.await.unwrap());
        }
        assert!(won[7], "the latest decision was refused: {won:?}");
        assert_eq!(get_state(&etcd, "m").await.unwrap().unwrap().t_ms, 1_007);

        // t_max per witness only rises; concurrent witnesses lose no update.
        assert_eq!(
            record_t_max(&etcd, "none", "w", 1).await.unwrap_err().kind(),
            ErrorKind::UnknownName
        );
        assert_eq!(
            record_t_max(&etcd, "m", "", 1).await.unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        assert!(record_t_max(&etcd, "m", "w0", 100).await.unwrap());
        assert!(!record_t_max(&etcd, "m", "w0", 50).await.unwrap());
        assert!(!record_t_max(&etcd, "m", "w0", 100).await.unwrap());
        assert!(record_t_max(&etcd, "m", "w0", 150).await.unwrap());
        let tasks: Vec<_> = (0..8u64)
            .flat_map(|i| [(i, 200 + i), (i, 100 + i)])
            .map(|(i, t)| {
                let etcd = etcd.clone();
                tokio::spawn(async move { record_t_max(&etcd, "m", &format!("w{i}"), t).await })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        let s = get_state(&etcd, "m").await.unwrap().unwrap();
        let want: BTreeMap<String, u64> = (0..8).map(|i| (format!("w{i}"), 200 + i)).collect();
        assert_eq!(s.t_max_ms, want);
        assert_eq!(s.t_ms, 1_007, "a witness changed the decision");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_second_rollback_of_a_model_is_refused() {
        let server = TestEtcd::start().await.unwrap();
        let etcd = etcd(&server).await;
        assert_eq!(begin_rollback(&etcd, "m").await.unwrap_err().kind(), ErrorKind::UnknownName);
        assert_eq!(end_rollback(&etcd, "m").await.unwrap_err().kind(), ErrorKind::UnknownName);
        assert!(put_state(&etcd, "m", &at(Health::Corrupted, 10)).await.unwrap());

        begin_rollback(&etcd, "m").await.unwrap();
        let e = begin_rollback(&etcd, "m").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Locked);
        assert_eq!(e.to_string(), "model 'm' is rolling back already");
        assert!(end_rollback(&etcd, "m").await.unwrap());
        assert!(!end_rollback(&etcd, "m").await.unwrap());

        // Two managers starting one at once: exactly one starts it.
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let etcd = etcd.clone();
                tokio::spawn(async move { begin_rollback(&etcd, "m").await })
            })
            .collect();
        let mut started = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(()) => started += 1,
                Err(e) => assert_eq!(e.kind(), ErrorKind::Locked),
            }
        }
        assert_eq!(started, 1);
        assert!(get_state(&etcd, "m").await.unwrap().unwrap().rolling_back);
    }
}
