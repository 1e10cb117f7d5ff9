#!/usr/bin/env bash
# Set up and run the demo end to end: generates demo_data/, then manifest -> token_lengths -> pack_plan
# -> packed_shards -> audit_report through Dagster. Extra arguments go to `pack-assets demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/pack-assets demo "$@"
