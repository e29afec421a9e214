#!/bin/bash
# embstore's sync vs Redis replication on the same emulated WAN, run after run (each run brings
# the WAN up and down), then the plot. Needs root and `make wan-deps`; about 12 minutes.
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
run ekko-direct-3x3 $d/ekko_peer.py --topology direct --rates 5000 15000 --raw "$out/raw"
run ekko-dcl-3x3-nodc1 $d/ekko_peer.py --no-dc1-followers --rates 15000 45000 --raw "$out/raw"
run ekko-dcl-3x3-0ms $d/ekko_peer.py --one-way-ms 0 --rates 15000 --raw "$out/raw"
run ekko-dcl-10x3 $d/ekko_peer.py --dcs 10 --rates 3500 9000 --raw "$out/raw"
"$py" $d/plot.py "$out"/ekko-dcl-3x3.json "$out"/redis-chain-3x3.json \
    --out docs/img/dissemination_vs_redis.png
left=$(ip netns list | grep -c '^ek-')
[ "$left" = 0 ] || echo "warning: $left ek-* namespaces left over" >&2
