#!/usr/bin/env bash
# The main job, as a user types it: set up, make data, train with save_dir,
# restart from latest, freeze from the checkpoint directory.
# The run happens in ./work-example (or $WORK_DIR).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/setup.sh"
export PATH="$root/.venv/bin:$PATH"
export OMP_NUM_THREADS=1 DP_INTRA_OP_PARALLELISM_THREADS=1 DP_INTER_OP_PARALLELISM_THREADS=1
work="${WORK_DIR:-$root/work-example}"
rm -rf "$work" && mkdir -p "$work" && cd "$work"

python "$root/examples/make_data.py" --out data
cp "$root/examples/input.json" input.json

dp --pt-expt train input.json                          # 20 steps, checkpoints in ./models
sed -i 's/"numb_steps": 20/"numb_steps": 30/' input.json
dp --pt-expt train input.json --restart latest         # continues from step 20 to 30
dp --pt-expt freeze -c models -o frozen                # freezes models/model.ckpt-30.pt

echo "--- models/"
ls -l models
echo "--- checkpoint: $(cat models/checkpoint)"
ls -l frozen.pte
