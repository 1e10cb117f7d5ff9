#!/usr/bin/env bash
# Create .venv (if needed) and install pack_assets with its extras (default: dev). Used by demo.sh and test.sh.
# PACK_ASSETS_EXTRAS=dev,energon adds the Megatron-Energon output test (pulls torch 2.14.1 + torchvision 0.29.1);
# `celery` adds dagster-celery + redis for the scale-out in deploy/celery/ (redis-server comes from apt);
# `train` adds torch (same pair) for PackCollator and the packed-equals-unpacked proof; `processor` adds the
# same pair + sentencepiece for the processor rule (videos included). All three pin one pair: they mix.
# `hf` adds the `datasets` package (the tests of `convert` on save_to_disk folders use it as their oracle).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
EXTRAS=${PACK_ASSETS_EXTRAS:-dev}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip >/dev/null
if ! .venv/bin/python -m pip install --quiet -e ".[$EXTRAS]"; then
  echo "setup: installing extras [$EXTRAS] failed; falling back to [dev] (the tests of the missing extras skip; under PACK_ASSETS_CI=1 they fail)" >&2
  .venv/bin/python -m pip install --quiet -e '.[dev]'
fi
