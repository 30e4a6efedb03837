#!/usr/bin/env bash
# The main job, as a user types it: set up, make data, train with save_dir,
# restart from latest, freeze from the checkpoint directory.
# BACKEND=pt-expt (the default) or BACKEND=pt picks deepmd-kit's backend:
#   bash examples/run.sh              # dp --pt-expt, freezes frozen.pte
#   BACKEND=pt bash examples/run.sh   # dp --pt, freezes frozen.pth
# The run happens in ./work-example (or $WORK_DIR).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
backend="${BACKEND:-pt-expt}"
case "$backend" in
    pt-expt|pt) ;;
    *) echo "BACKEND must be pt-expt or pt, not '$backend'" >&2; exit 2 ;;
esac
bash "$root/scripts/setup.sh"
export PATH="$root/.venv/bin:$PATH"
export OMP_NUM_THREADS=1 DP_INTRA_OP_PARALLELISM_THREADS=1 DP_INTER_OP_PARALLELISM_THREADS=1
work="${WORK_DIR:-$root/work-example}"
rm -rf "$work" && mkdir -p "$work" && cd "$work"

python "$root/examples/make_data.py" --out data
cp "$root/examples/input.json" input.json

dp --"$backend" train input.json                       # 20 steps, checkpoints in ./models
sed -i 's/"numb_steps": 20/"numb_steps": 30/' input.json
dp --"$backend" train input.json --restart latest      # continues from step 20 to 30
dp --"$backend" freeze -c models -o frozen             # freezes models/model.ckpt-30.pt

echo "--- models/"
ls -l models
echo "--- checkpoint: $(cat models/checkpoint)"
ls -l frozen.*
