"""`python -m batcher`: run the scheduler service until SIGINT / SIGTERM."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

from batcher.service.leader import serve
from batcher.settings import BatcherSettings
from common import streams
from common.gc_tuning import tune_gc
from common.logging_setup import configure_logging
from common.redis_io.redis_conn import connect

# `--healthcheck` passes while the batcher refreshed its stats this recently (seconds).
HEALTHY_WITHIN_S = 10.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m batcher", description="The continuous-batching scheduler."
    )
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument(
        "--healthcheck", action="store_true", help="exit 0 if a batcher is alive on REDIS_URL, else 1"
    )
    return parser.parse_args(argv)


def healthcheck(settings: BatcherSettings) -> int:
    client = connect(settings.redis_url, settings.redis_cluster)
    try:
        updated: bytes | None = client.hget(streams.cell_keys(settings.cell).stats, "updated_at")  # type: ignore[assignment]
    finally:
        client.close()
    return 0 if updated is not None and time.time() - float(updated) < HEALTHY_WITHIN_S else 1


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    settings = BatcherSettings()
    if args.healthcheck:
        sys.exit(healthcheck(settings))
    configure_logging("batcher", settings.log_format, args.log_level)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    client = connect(settings.redis_url, settings.redis_cluster)
    tune_gc()  # startup is over: what it made is never walked again
    try:
        serve(settings, client, stop)
    finally:
        client.close()


if __name__ == "__main__":
    main()
