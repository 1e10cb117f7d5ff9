#!/bin/bash
# Issue 41 (bench/results/plan_rss_i41_s47_10m.json): the main process VmHWM of `pack-assets run` up to its plan.
# plan_rss_e2e_until_plan.sh LABEL CODE (WORK=<scratch copy of a counted work folder> INPUT=<its shards>):
# `pack-assets run` on the copy (fresh Dagster home, no previous plan: its DuckDB file is deleted) until
# the plan is made (what_if.json written), the command's main process's VmHWM read then, and the run stopped.
L=$1; CODE=$2
export PYTHONPATH=$CODE PATH=/work/main/.venv/bin:$PATH
W=${WORK:?}; O=/tmp/planrss_out_$L; H=/tmp/planrss_home_$L
rm -rf $W/pack_assets.duckdb* $W/pack_plan.jsonl $W/what_if.json $O $H; mkdir -p $H
cd "$(dirname "$W")"
DAGSTER_HOME=$H setsid pack-assets run --input ${INPUT:?} --work $W --out $O --max-len 16384 > $L.run.out 2> $L.run.err &
PID=$!
echo pid $PID
t0=$(date +%s); maxrss=0; maxkids=0
while kill -0 $PID 2>/dev/null; do
  r=$(awk '/VmRSS/{print $2}' /proc/$PID/status 2>/dev/null); h=$(awk '/VmHWM/{print $2}' /proc/$PID/status 2>/dev/null)
  [ -n "$r" ] && [ "$r" -gt "$maxrss" ] && maxrss=$r
  if [ -f $W/what_if.json ]; then
    echo "plan done at $(( $(date +%s) - t0 )) s: main VmHWM ${h} kB, sampled max VmRSS ${maxrss} kB"
    sleep 1; h=$(awk '/VmHWM/{print $2}' /proc/$PID/status); echo "VmHWM 1s later ${h} kB"
    kill -- -$PID; break
  fi
  sleep 0.2
done
wait $PID 2>/dev/null
echo "max VmRSS ${maxrss} kB"
