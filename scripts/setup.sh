#!/usr/bin/env bash
# Create .venv (if needed) and install dp-ckpt-plugin with deepmd-kit, torch,
# the test and the docs tools (moto's S3 server among them), and obstore for
# object storage. Safe to run again: pip skips what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[torch,test,docs,s3]"
