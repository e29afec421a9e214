"""The pure parts of the dissemination benchmark harness (no namespaces): the seeded trace,
the latency definition (max over replicas of visible - commit) and the writer's SET encoding."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
from dissemination import latency
from dissemination.redis_writer import encode_sets
from dissemination.resp import Conn
from dissemination.trace import Trace, rate_for_rho, rho


def test_trace_is_deterministic_and_batched_at_the_rate():
    t = Trace(seed=3, rows=1000, rate=2000, duration=0.5, batch_ms=10)
    k1, v1 = t.keys_values()
    k2, v2 = Trace(seed=3, rows=1000, rate=2000, duration=0.5).keys_values()
    assert np.array_equal(k1, k2) and np.array_equal(v1, v2)
    assert not np.array_equal(
        k1, Trace(seed=4, rows=1000, rate=2000, duration=0.5).keys_values()[0]
    )
    assert k1.min() >= 0 and k1.max() < 1000 and v1.shape == (1000, 16) and v1.dtype == np.float32
    b = list(t.batches())
    assert len(b) == 50 and all(stop - start == 20 for _, start, stop in b)
    assert b[-1][2] == t.updates and b[0][0] == pytest.approx(0.01)
    # Zipf: the hottest key takes far more than 1/rows of the updates.
    assert np.bincount(k1).max() > 50
    with pytest.raises(ValueError):
        Trace(rate=0)


def test_rho_round_trips():
    rate = rate_for_rho(0.9, 122, 30, 3, 50)
    assert rho(rate * 122, 30, 3, 50) == pytest.approx(0.9)
    assert 4_700 < rate < 4_900  # the spec's "rho = 0.9 <=> about 4.8 k rows/s"


def test_latency_is_the_max_over_replicas_and_weighted_by_rows():
    commits = np.array([[1_000, 10, 3], [2_000, 20, 1], [3_000, 30, 1]])
    fast = np.array([[1_500, 10], [2_500, 30]])
    slow = np.array([[4_000, 20], [9_000, 30]])
    lat, missing = latency.update_latencies(commits, {"f": fast, "s": slow})
    assert missing == 0
    assert np.allclose(lat, [0.003, 0.002, 0.006])
    s = latency.summary(commits, {"f": fast, "s": slow}, wan_bytes=500)
    assert s["updates"] == 5 and s["wan_bytes_per_update"] == 100.0
    assert s["mean_s"] == pytest.approx((3 * 0.003 + 0.002 + 0.006) / 5)
    lat, missing = latency.update_latencies(commits, {"f": fast, "never": np.array([[5, 10]])})
    assert missing == 2 and np.isnan(lat[1:]).all()


class _FakeSock:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def recv(self, n: int) -> bytes:
        out, self.data = self.data[:n], self.data[n:]
        return out


def test_encoded_sets_parse_back():
    keys = np.array([0, 42, 1048575])
    values = np.arange(48, dtype=np.float32).reshape(3, 16)
    raw = encode_sets(keys, values).tobytes()
    conn = Conn(_FakeSock(raw))
    for key, row in zip(keys, values, strict=True):
        cmd = conn.reply()
        assert cmd[0] == b"SET" and cmd[1] == b"r%07d" % key
        assert np.array_equal(np.frombuffer(cmd[2], dtype=np.float32), row)
    assert len(raw) == 3 * 98


def _events(rows, table: str = "hot"):
    """Records of ``table`` from ``(t_us, part, newest_ts)``."""
    tid = latency.table_id(table)
    return np.array([(t, tid, p, n) for t, p, n in rows], dtype=latency.EVENT_DTYPE)


def test_event_records_parse_and_a_partial_record_is_ignored():
    ev = _events([(1_000, 3, 7), (2_000, 5, 1 << 60)])
    raw = ev.tobytes()
    assert len(raw) == 48
    back = latency.read_events(raw + raw[:7])
    assert np.array_equal(back, ev) and int(back["newest_ts"][1]) == 1 << 60


def test_records_name_their_table_as_the_follower_does():
    # The follower writes the CRC-32 of the name (Rust test `table_ids_are_crc32_of_the_name`).
    assert latency.table_id("hot") == 210272711
    both = np.concatenate([_events([(1, 2, 3)]), _events([(4, 2, 6)], table="idle0")])
    assert latency.of_table(both, "hot")["t_us"].tolist() == [1]


def test_row_visibility_is_the_first_event_of_its_part_that_knows_its_version():
    # Part 1 learns ts 10 at 100 and ts 30 at 300; part 2 learns ts 20 at 150; an event with
    # a smaller newest_ts after a larger one (another reply) does not unlearn it.
    ev = _events([(300, 1, 30), (100, 1, 10), (150, 2, 20), (400, 1, 25), (50, 2, 5)])
    part = np.array([1, 1, 1, 2, 2, 7])
    ts = np.array([10, 11, 30, 5, 21, 1], dtype=np.uint64)
    vis = latency.row_visible_times(part, ts, ev)
    assert vis.tolist() == [100, 300, 300, 50, -1, -1]
    assert latency.row_visible_times(part, ts, _events([])).tolist() == [-1] * 6


def test_row_latency_is_the_max_over_followers_from_its_batch_commit():
    commit = np.array([1_000, 2_000])
    batch = np.array([0, 0, 1])
    part = np.array([0, 1, 0])
    ts = np.array([5, 6, 9], dtype=np.uint64)
    near = _events([(1_100, 0, 5), (1_200, 1, 6), (2_100, 0, 9)])
    far = _events([(1_050, 1, 6), (4_000, 0, 9)])  # one reply of part 0 carries both writes
    lat, missing = latency.row_latencies(commit, batch, part, ts, {"near": near, "far": far})
    assert missing == 0 and np.allclose(lat, [0.003, 0.0002, 0.002])
    s = latency.stats(lat, np.ones(3, dtype=np.int64), missing, wan_bytes=30)
    assert s["updates"] == 3 and s["wan_bytes_per_update"] == 10.0
    assert s["mean_s"] == pytest.approx((0.003 + 0.0002 + 0.002) / 3, abs=1e-4)
    lat, missing = latency.row_latencies(
        commit, batch, part, ts, {"near": near, "lost": _events([(1_500, 1, 6)])}
    )
    assert missing == 2 and np.isnan(lat[[0, 2]]).all() and lat[1] == pytest.approx(0.0005)


def test_ekko_topologies():
    from dissemination.ekko_peer import is_leader, upstream

    assert upstream("dc-leader", 1, 2) == (1, 1) and not is_leader("dc-leader", 1, 2)
    assert upstream("dc-leader", 3, 1) == (1, 1) and is_leader("dc-leader", 3, 1)
    assert upstream("dc-leader", 3, 2) == (3, 1) and not is_leader("dc-leader", 3, 2)
    assert upstream("direct", 3, 2) == (1, 1) and not is_leader("direct", 3, 1)


def test_twopc_frames_round_trip():
    from dissemination import twopc

    keys = np.array([5, 1, 1 << 40], dtype=np.int64)
    values = np.arange(3 * 16, dtype=np.float32).reshape(3, 16)
    frame = twopc.encode(twopc.PREPARE, 7, keys, values)
    length, kind, n, rows = twopc.decode_header(frame)
    assert (kind, n, rows) == (twopc.PREPARE, 7, 3) and length + 4 == len(frame)
    assert len(frame) == twopc.FRAME_OVERHEAD + 3 * (8 + 64)
    k, v = twopc.decode_rows(frame[twopc.HEADER.size :], rows, 16)
    assert np.array_equal(k, keys) and np.array_equal(v, values)
    ack = twopc.encode(twopc.ACK, 9)
    assert len(ack) == twopc.HEADER.size and twopc.decode_header(ack)[1:] == (twopc.ACK, 9, 0)


def test_twopc_commits_in_order_once_every_backup_acked():
    from dissemination.twopc import CommitRule

    c = CommitRule(3)
    assert c.ack(1) == [] and c.ack(1) == [] and c.ack(1) == []  # 1 waits for 0
    assert c.ack(0) == [] and c.ack(0) == []
    assert c.ack(0) == [0, 1] and c.next == 2
    assert c.ack(2) == [] and c.ack(2) == [] and c.ack(2) == [2]
    with pytest.raises(ValueError):
        c.ack(1)  # already committed
    c.ack(3), c.ack(3), c.ack(3)
    with pytest.raises(ValueError):
        c.ack(4), c.ack(4), c.ack(4), c.ack(4)  # more acks than backups
    with pytest.raises(ValueError):
        CommitRule(0)


def test_twopc_rho_is_the_primary_nic_load():
    from dissemination import twopc

    # 3 DCs x 3: 8 backups, 72 B of key and values per row plus TCP/IP headers.
    rate = twopc.rate_for_rho_2pc(0.9, 16, 9, 50)
    assert twopc.rho_2pc(rate, 16, 9, 50) == pytest.approx(0.9)
    assert rate * 8 * twopc.row_wire_bytes(16) * 8 == pytest.approx(0.9 * 50e6)
    assert 75 < twopc.row_wire_bytes(16) < 76


def test_checkpoint_cycle_is_link_bound():
    from dissemination.twopc import checkpoint_cycle_s

    # 2 DCs: one copy, bound by the 48 Mbit WAN class rather than the 50 Mbit NIC.
    c = checkpoint_cycle_s(6e6, 2, 3, 50, 48)
    assert c["wan_stage_s"] == pytest.approx(1.0) and c["dc_stage_s"] == pytest.approx(1.92)
    # 10 DCs: 9 copies through the primary's NIC.
    c = checkpoint_cycle_s(6.25e6, 10, 3, 50, 48)
    assert c["wan_stage_s"] == pytest.approx(9.0) and c["mean_latency_s"] == pytest.approx(16.5)


def test_ablation_flags():
    from dissemination.ekko_peer import parse_args

    a0 = parse_args(["--ablation", "A0", "--rates", "1000"])
    assert (a0.topology, a0.source_no_cache, a0.no_shard_versions) == ("direct", True, True)
    a2 = parse_args(["--ablation", "A2", "--cold-tables", "7", "--rates", "1000"])
    assert (a2.topology, a2.source_no_cache, a2.no_shard_versions) == ("direct", False, False)
    assert a2.cold_tables == 7
    a3 = parse_args(["--ablation", "A3", "--rhos", "0.5"])
    assert a3.topology == "dc-leader" and a3.rates == [5189]


def test_window_means_and_baseline_tables():
    from dissemination.plot_baselines import e1_points, e1_table, e4_points, e4_table

    net = {"dcs": 3, "servers": 3, "one_way_ms": 25}

    def rec(system, mean, **kw):
        r = {"system": system, "mean_s": mean, "p99_s": 2 * mean, "rho_2pc": 0.9, "network": net}
        r.update(topology="dc-leader", rate_rows_s=9340, wan_bytes_per_update=100.0, **kw)
        return r

    recs = [
        rec("embstore", 0.2, discarded=True),
        rec("embstore", 0.25),
        rec("embstore", 0.3, discarded=True),  # a later discarded run does not replace a kept one
        rec("2pc", 1.0),
        rec("embstore", 9.0, ablation="A0"),  # not E1
    ]
    pts = e1_points(recs)
    assert pts[("embstore", 3, 0.9)]["mean_s"] == 0.25 and pts[("2pc", 3, 0.9)]["mean_s"] == 1.0
    assert "| 4.00x |" in e1_table(pts)
    common = dict(source_cache=True, shard_versions=True, cold_tables=7)
    common.update(primary_sync_bytes_per_update=1.0, source_table_stats_run={"all": {}})
    abl = [
        rec("embstore", 1.0, ablation="A0", **common),
        rec("embstore", 0.1, ablation="A3", **common),
    ]
    table = e4_table(e4_points(abl))
    assert "| 10.00x |" in table and "A0 / A3 = 10.0x" in table
