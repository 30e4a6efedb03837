#!/usr/bin/env bash
# The main job: set up, train with save_dir, get killed, resume from latest.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/setup.sh"
py="$root/.venv/bin/python"
work="${WORK_DIR:-$root/work-example}"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$py" "$root/examples/numpy_train.py" --save-dir models --steps 100 --kill-at 70 || echo "(killed at step 70, as asked)"
"$py" "$root/examples/numpy_train.py" --save-dir models --steps 200 --restart latest
ls models
