#!/bin/bash
# embstore's sync vs Redis replication on the same emulated WAN, run after run (each run brings
# the WAN up and down), then the plot; then E6 on loopback and the plots of E2, E3, E5 and E6.
# Needs root and `make wan-deps`; about 25 minutes.
#   python/benchmarks/dissemination/compare.sh [OUT_DIR]   (default /tmp/dissemination)
# Writes OUT_DIR/*.json (one record per run), OUT_DIR/*.log (progress), OUT_DIR/raw (events and
# follower logs), OUT_DIR/e6 (E6's records), docs/img/dissemination_vs_redis.png, and the plots
# docs/img/e2_checkpoint.png, e3_slow_link.png, e5_cache.png and e6_skip.png. Run from the
# repository root.
set -u
out=${1:-/tmp/dissemination}
py=${PY:-.venv/bin/python}
d=python/benchmarks/dissemination
mkdir -p "$out"
run() {  # NAME SCRIPT ARGS...
    local name=$1; shift
    echo "== $name" >&2
    "$py" "$@" --json "$out/$name.json" 2> "$out/$name.log" || echo "$name failed: see $out/$name.log" >&2
}
run ekko-dcl-3x3 $d/ekko_peer.py --rates 15000 45000 --raw "$out/raw"
run redis-chain-3x3 $d/redis_peer.py --rates 15000 45000
# The lossy option (f16 values on the wire), and the wire before packed answers (protocol 5):
run ekko-dcl-3x3-f16 $d/ekko_peer.py --sync-precision f16 --rates 15000 45000 --raw "$out/raw"
run ekko-dcl-3x3-p5 $d/ekko_peer.py --sync-protocol 5 --rates 15000 45000 --raw "$out/raw"
run ekko-dcl-3x3-nodc1 $d/ekko_peer.py --no-dc1-followers --rates 15000 45000 --raw "$out/raw"
run ekko-direct-3x3 $d/ekko_peer.py --topology direct --rates 5000 15000 --raw "$out/raw"
run redis-direct-3x3 $d/redis_peer.py --topology direct --rates 5000 15000
run ekko-dcl-3x3-0ms $d/ekko_peer.py --one-way-ms 0 --rates 15000 --raw "$out/raw"
run redis-chain-3x3-0ms $d/redis_peer.py --one-way-ms 0 --rates 15000
run ekko-dcl-10x3 $d/ekko_peer.py --dcs 10 --rates 3500 9000 --raw "$out/raw"
run redis-chain-10x3 $d/redis_peer.py --dcs 10 --rates 3500 9000
# Longer runs over the Redis limit (about 5 more minutes):
#   run ekko-dcl-3x3-90s $d/ekko_peer.py --rates 45000 --duration 90 --raw "$out/raw"
#   run redis-chain-3x3-90s $d/redis_peer.py --rates 45000 --duration 90 --drain 120
# A run with "discarded": true (box CPU over 70 %) must be rerun; plot.py draws the last kept one.
"$py" $d/plot.py "$out"/*.json --out docs/img/dissemination_vs_redis.png
"$py" $d/plot.py --table "$out"/*.json
# E6 (no WAN: a count on loopback, about 3 minutes): parts skipped by shard versions, then the
# plots of E2, E3 and E5 from the records kept in docs/data. Its records go to OUT_DIR/e6 (they
# are no WAN runs, which plot.py reads).
mkdir -p "$out/e6"
echo "== e6-skip" >&2
"$py" $d/e6_skip.py --json "$out/e6/e6-skip.json" --plot docs/img/e6_skip.png 2> "$out/e6/e6-skip.log" \
    || echo "e6-skip failed: see $out/e6/e6-skip.log" >&2
"$py" $d/plot_experiments.py --data docs/data --out docs/img --only e2 e3 e5
left=$(ip netns list | grep -c '^ek-')
[ "$left" = 0 ] || echo "warning: $left ek-* namespaces left over" >&2
