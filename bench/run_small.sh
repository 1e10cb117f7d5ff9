#!/bin/sh
# One whole `pack-assets run` on the small photo set (bench/photo_set.py), for a paired whole-process timing of
# two codes (A and B alternating, each run timed from outside, e.g. with /usr/bin/time -v):
#     bench/run_small.sh SRC RUNDIR COLD [INPUT]
# SRC: a folder holding the code's pack_assets package (first on PYTHONPATH: this checkout, or a baseline's
# `git archive <commit> pack_assets` / `git worktree`); RUNDIR: its work, output, Dagster home and tokenizer
# cache; fresh work and output folders every run. COLD=1 also a fresh Dagster home, an empty tokenizer cache
# and the page cache dropped (root) before the run. Python: $PYTHON (default: python3), run with -P: from a checkout,
# `-m` would otherwise import the checkout's package whatever PYTHONPATH says.
src=$1; d=$2; input=${4:-bench/out/photos}
rm -rf "$d/work" "$d/packed"
if [ "$3" = 1 ]; then rm -rf "$d/dagster_home" "$d/cache"; sync; echo 3 > /proc/sys/vm/drop_caches; fi
mkdir -p "$d"
PYTHONPATH=$src PACK_ASSETS_CACHE=$d/cache exec "${PYTHON:-python3}" -P -m pack_assets.cli run \
  --input "$input" --max-len 8192 --profile qwen2.5-vl --algorithm bfd \
  --work "$d/work" --output "$d/packed" --dagster-home "$d/dagster_home" --json
