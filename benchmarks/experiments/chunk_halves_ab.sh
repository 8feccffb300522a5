#!/usr/bin/env bash
# On the lent GPU machine, from the repository root:
#   bash benchmarks/experiments/chunk_halves_ab.sh OUTDIR [T,T,... ("": dense only)] [EXPERTS] [ROUNDS]
# chunk_halves_probe's A/B in one call: the shipped read and the halves read (tree in /root/halves), alternated,
# each order (wgmma; mma2 under DISABLE_MMA_V3) once a round, so a call cut short still has one of
# each. A process past 150 s is stopped (its rows so far are kept: the probe writes each as it comes).
OUT=${1:?usage: chunk_halves_ab.sh OUTDIR [T,...] [EXPERTS] [ROUNDS]}; TS=${2-64,512,2048,4096,8192}; E=${3:-32}
P=benchmarks/experiments/chunk_halves_probe.py
for t in halves gather; do python3 $P tree /root/$t $t >/dev/null; done
for round in $(seq ${4:-2}); do
  for order in wgmma mma2; do
    mma=""; [ $order = mma2 ] && mma=1
    for tree in ${TREES:-shipped halves}; do
      path=$PWD; [ $tree != shipped ] && path=/root/$tree
      echo "== round $round $order $tree $(date +%T)"
      DISABLE_MMA_V3=$mma PYTHONPATH=$path timeout 150 python3 $P time "$OUT/${order}_${tree}_$round.json" "$TS" "$E" \
        | cut -c1-200
    done
  done
done
