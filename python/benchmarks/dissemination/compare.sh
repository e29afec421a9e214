#!/bin/bash
# embstore's sync vs Redis replication on the same emulated WAN, run after run (each run brings
# the WAN up and down), then the plot. Needs root and `make wan-deps`; about 17 minutes.
#   python/benchmarks/dissemination/compare.sh [OUT_DIR]   (default /tmp/dissemination)
# Writes OUT_DIR/*.json (one record per run), OUT_DIR/*.log (progress), OUT_DIR/raw (events and
# follower logs) and docs/img/dissemination_vs_redis.png. Run from the repository root.
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
left=$(ip netns list | grep -c '^ek-')
[ "$left" = 0 ] || echo "warning: $left ek-* namespaces left over" >&2
