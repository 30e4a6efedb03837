"""A local S3 endpoint for trying a remote save_dir: moto's server on loopback.

    python examples/s3_endpoint.py --port 9000 --bucket ckpt

Runs until stopped (Ctrl-C or SIGTERM) and prints, once the bucket exists, the
variables that point the AWS tools (and dp_ckpt_plugin) at it. The data lives
in this process's memory: it is gone when the endpoint stops.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--bucket", default="ckpt")
    args = parser.parse_args()
    try:
        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError:
        sys.stderr.write("needs moto[server]: pip install -e '.[test,s3]'\n")
        return 2
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=args.port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{args.port}"
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="local",
        aws_secret_access_key="local-secret",
        region_name="us-east-1",
    ).create_bucket(Bucket=args.bucket)
    print(
        f"export AWS_ENDPOINT_URL={endpoint} AWS_ACCESS_KEY_ID=local "
        "AWS_SECRET_ACCESS_KEY=local-secret AWS_REGION=us-east-1",
        flush=True,
    )
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
