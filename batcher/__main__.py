"""`python -m batcher`: run the scheduler service until SIGINT / SIGTERM."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from batcher.service import Batcher
from batcher.settings import BatcherSettings
from common.redis_conn import connect


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m batcher", description=__doc__)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    settings = BatcherSettings()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    client = connect(settings.redis_url)
    try:
        Batcher(settings, client).run(stop)
    finally:
        client.close()


if __name__ == "__main__":
    main()
