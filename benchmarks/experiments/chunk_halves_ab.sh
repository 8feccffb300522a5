#!/usr/bin/env bash
# On the lent GPU machine, from the repository root:
#   [TREES="shipped halves gather words"] bash benchmarks/experiments/chunk_halves_ab.sh OUTDIR [T,T,... ("": dense
#   only)] [EXPERTS] [ROUNDS]
# chunk_halves_probe's A/B in one call: `time` under each tree TREES names (default "shipped halves"; the others built
# by `tree` into /root/<tree>), taken in turns, each order (wgmma; mma2 under DISABLE_MMA_V3) once a round. A process
# past 150 s is stopped; the probe writes each row as it comes, so its rows so far are kept. The words tree's change
# runs only at T = 1, 2 (the decode GEMVs).
set -u
OUT=${1:?usage: chunk_halves_ab.sh OUTDIR [T,...] [EXPERTS] [ROUNDS]}; TS=${2-64,512,2048,4096,8192}; E=${3:-32}
P=benchmarks/experiments/chunk_halves_probe.py
TREES=${TREES:-shipped halves}
mkdir -p "$OUT"
for t in $TREES; do
  [ "$t" = shipped ] || python3 $P tree /root/$t $t >/dev/null || exit 1
done
for round in $(seq ${4:-2}); do
  for order in wgmma mma2; do
    mma=""; [ $order = mma2 ] && mma=1
    for tree in $TREES; do
      path=$PWD; [ $tree != shipped ] && path=/root/$tree
      echo "== round $round $order $tree $(date +%T)"
      DISABLE_MMA_V3=$mma PYTHONPATH=$path timeout 150 python3 $P time "$OUT/${order}_${tree}_$round.json" "$TS" "$E" \
        | cut -c1-200
      echo "rc ${PIPESTATUS[0]}"
    done
  done
done
