"""Create the MLflow artifact bucket in the S3-compatible store, once: the compose stack's
``create-bucket`` service runs it before the tracking server starts (and the integration test
runs it against its own S3 endpoint).

    python create_bucket.py BUCKET

Reads ``MLFLOW_S3_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and
``AWS_DEFAULT_REGION`` — the variables the MLflow server itself uses for the same store. An
existing bucket is left as it is, so restarting the stack keeps its artifacts. The store may
still be starting: connection errors are retried for ``--wait`` seconds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError, EndpointConnectionError


def ensure_bucket(client, bucket: str) -> bool:
    """Create ``bucket`` unless it exists; return True when this call created it."""
    try:
        client.head_bucket(Bucket=bucket)
        return False
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket", "NotFound"):
            raise
    client.create_bucket(Bucket=bucket)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bucket")
    parser.add_argument("--wait", type=float, default=60.0, help="seconds to retry while the store starts")
    args = parser.parse_args(argv)

    endpoint = os.environ.get("MLFLOW_S3_ENDPOINT_URL")
    if not endpoint:
        print("MLFLOW_S3_ENDPOINT_URL is not set: the S3 store's address, e.g. http://s3:9000", file=sys.stderr)
        return 2
    # path-style requests (http://s3:9000/BUCKET/key): a compose service name has no DNS for
    # BUCKET.s3; the MLflow server is set the same way (MLFLOW_BOTO_CLIENT_ADDRESSING_STYLE=path)
    client = boto3.client("s3", endpoint_url=endpoint, config=Config(s3={"addressing_style": "path"}))
    deadline = time.monotonic() + args.wait
    while True:
        try:
            created = ensure_bucket(client, args.bucket)
            break
        except EndpointConnectionError as error:
            if time.monotonic() > deadline:
                print(f"S3 store at {endpoint} unreachable after {args.wait:.0f} s: {error}", file=sys.stderr)
                return 1
            time.sleep(1.0)
    print(f"bucket {args.bucket!r} at {endpoint}: {'created' if created else 'already there'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
