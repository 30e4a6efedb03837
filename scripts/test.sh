#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite, ruff included, on
# TEST_WORKERS pytest-xdist workers (2 by default; 0 runs it in this process),
# then list the 15 slowest tests.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not e2e"`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec .venv/bin/python -m pytest -ra -n "${TEST_WORKERS:-2}" --dist loadgroup \
    --no-loadscope-reorder --durations=15 "$@"
