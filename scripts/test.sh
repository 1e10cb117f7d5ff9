#!/usr/bin/env bash
# Set up and run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The lint first (ruff, pinned in the dev extra; its rules in pyproject.toml [tool.ruff]): an error fails the run.
.venv/bin/ruff check .
# Tests run on every core (pytest-xdist; every test works in its own tmp_path and picks free ports).
# PACK_ASSETS_TEST_WORKERS=0 runs them in one process.
.venv/bin/python -m pytest -q -n "${PACK_ASSETS_TEST_WORKERS:-auto}" "$@"
