#!/usr/bin/env bash
# The main job, as a user types it: set up, make data, train with save_dir,
# restart from latest, freeze from the checkpoint directory.
# BACKEND=pt-expt (the default) or BACKEND=pt picks deepmd-kit's backend:
#   bash examples/run.sh              # dp --pt-expt, freezes frozen.pte
#   BACKEND=pt bash examples/run.sh   # dp --pt, freezes frozen.pth
# SAVE_DIR=s3://bucket/run puts the checkpoints on object storage (see
# examples/run_s3.sh, which starts a local S3 endpoint for it).
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
save_dir="${SAVE_DIR:-models}"
sed "s#\"save_dir\": \"models\"#\"save_dir\": \"$save_dir\"#" "$root/examples/input.json" > input.json

case "$save_dir" in
*://*)  # on object storage: each run stages its checkpoints locally first
    export DP_CKPT_STAGING="$work/node-a"
    dp --"$backend" train input.json                   # 20 steps, uploaded to $save_dir
    sed -i 's/"numb_steps": 20/"numb_steps": 30/' input.json
    export DP_CKPT_STAGING="$work/node-b"              # another node: nothing staged
    dp --"$backend" train input.json --restart latest  # reads HEAD, continues from 20 to 30
    dp --"$backend" freeze -c "$save_dir" -o frozen    # freezes the store's latest (step 30)
    echo "--- $save_dir"
    dp-ckpt ls "$save_dir"
    dp-ckpt verify "$save_dir"
    ;;
*)
    dp --"$backend" train input.json                   # 20 steps, checkpoints in ./models
    sed -i 's/"numb_steps": 20/"numb_steps": 30/' input.json
    dp-ckpt check input.json --restart latest          # will it load? (exit 0: yes)
    dp --"$backend" train input.json --restart latest  # continues from step 20 to 30, not exactly:
                                                       # the schedule follows numb_steps (it says so)
    dp --"$backend" freeze -c models -o frozen         # freezes models/model.ckpt-30.pt
    dp-ckpt show models                                # where it came from
    echo "--- models/"
    ls -l models
    echo "--- checkpoint: $(cat models/checkpoint)"
    ;;
esac
ls -l frozen.*
