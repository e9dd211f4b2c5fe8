"""moto's S3 server counting the requests it serves, in a process of its own: `python -m bench.counting_s3`.

For benchmarks that count what a client asks S3. Two paths beside S3's API, under `/_bench/`:

- `POST /_bench/objects?bucket=B`: the body's lines are object keys, each put into moto's backend directly
  with its key as its bytes (10^5 puts through the S3 API take minutes; this takes seconds);
- `GET /_bench/counts`: the requests served so far, by kind (`list`, `head`, `get`, `put`, ...), as JSON.

It prints `ready <port>` once it serves. Run in its own process so that moto's Python request handling never
competes for a GIL with what is measured.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs

from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from moto.s3.models import s3_backends
from werkzeug.serving import make_server

StartResponse = Callable[..., Any]


def put_objects(bucket: str, keys: list[str]) -> None:
    """Each key as an object holding its own name, straight into moto's backend."""
    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    if bucket not in backend.buckets:
        backend.create_bucket(bucket, "us-east-1")
    for key in keys:
        backend.put_object(bucket, key, key.encode())


def counting_app() -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    moto_app = DomainDispatcherApplication(create_backend_app)
    counts: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def answer(start_response: StartResponse, payload: object) -> Iterable[bytes]:
        body = json.dumps(payload).encode()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path, method = environ.get("PATH_INFO", ""), environ["REQUEST_METHOD"]
        if path == "/_bench/counts":
            with lock:
                return answer(start_response, dict(counts))
        if path == "/_bench/objects":
            bucket = parse_qs(environ.get("QUERY_STRING", ""))["bucket"][0]
            size = int(environ.get("CONTENT_LENGTH") or 0)
            keys = environ["wsgi.input"].read(size).decode().split()
            put_objects(bucket, keys)
            return answer(start_response, {"put": len(keys)})
        kind = (
            "list" if method == "GET" and "list-type=2" in environ.get("QUERY_STRING", "") else method.lower()
        )
        with lock:
            counts[kind] += 1
        result: Iterable[bytes] = moto_app(environ, start_response)
        return result

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.counting_s3", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # it would log every request
    server = make_server(
        "127.0.0.1", args.port, counting_app(), threaded=True, request_handler=MotoRequestHandler
    )
    print(f"ready {args.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
