#!/usr/bin/env bash
# The main job on object storage: a local S3 endpoint (moto, on 127.0.0.1),
# then the same train / restart / freeze as examples/run.sh with
# training.save_dir "s3://ckpt/run". The restart runs from an empty staging
# directory, as on another node that shares no file system with the first.
#   bash examples/run_s3.sh
# With a real bucket: export the AWS variables and set SAVE_DIR=s3://bucket/run.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/setup.sh"
if [ -z "${SAVE_DIR:-}" ]; then
    port=$("$root/.venv/bin/python" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
    fifo=$(mktemp -u); mkfifo "$fifo"
    "$root/.venv/bin/python" "$root/examples/s3_endpoint.py" --port "$port" --bucket ckpt > "$fifo" &
    endpoint_pid=$!
    trap 'kill $endpoint_pid 2>/dev/null || true; rm -f "$fifo"' EXIT
    read -r line < "$fifo"
    eval "$line"                        # AWS_ENDPOINT_URL and keys of the local endpoint
    echo "--- local S3 endpoint: $AWS_ENDPOINT_URL"
    export SAVE_DIR=s3://ckpt/run
fi
SAVE_DIR="$SAVE_DIR" bash "$root/examples/run.sh"
