"""How long one large request stalls a gateway's other requests, and what memory it keeps.

    python -m scripts.measure_loop_stall                        # the demo model, 3 MB requests
    python -m scripts.measure_loop_stall --mib 3.5 --burst 40

Starts a private redis-server and ONE gateway process (no batcher or worker: every large request
below is answered, or refused, before anything is queued) on `--model` (the shipped demo model, a
real 4,096-token byte-level BPE). For each kind of large request, sent alone, a second client sends
`GET /v1/models` one after another until the large one is answered: the longest of those is the
stall a concurrent small request sees. Kinds: `tokenize` (POST /tokenize of the text), `chat` (one
user message of the text: 400 prompt_too_long once tokenized), `chat_many` (the body full of short
messages: most of its cost is parsing and validating them), `ids` (a completions prompt of token
ids). Then `--burst` large requests at once (tokenize and chat, alternating) while the gateway's
RSS is sampled: its peak, and what it holds once they are answered and after `--idle` seconds.
Prints one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from harness.load.leftovers import rss_kib
from harness.processes.redis_server import redis_server
from harness.processes.services import Stack, wait_for
from harness.processes.stack_script import stack_script_parser


def _text(num_bytes: int) -> str:
    """English prose (the Python docs the demo model was trained on) repeated to `num_bytes`."""
    from pydoc_data.topics import topics

    corpus = "\n\n".join(topics.values())
    return (corpus * (num_bytes // len(corpus) + 1))[:num_bytes]


def bodies(model: str, num_bytes: int) -> dict[str, tuple[str, bytes]]:
    """Each kind's path and JSON body, encoded once here so the client's own loop does not stall."""
    text = _text(num_bytes)
    message = {"role": "user", "content": "hi there"}
    num_messages = num_bytes // len(json.dumps(message))
    num_ids = num_bytes // 3  # "12," per id, compact JSON
    made = {
        "tokenize": ("/tokenize", {"model": model, "prompt": text}),
        "chat": ("/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": text}]}),
        "chat_many": ("/v1/chat/completions", {"model": model, "messages": [message] * num_messages}),
        "ids": ("/v1/completions", {"model": model, "prompt": [12] * num_ids}),
    }
    return {
        kind: (path, json.dumps(body, separators=(",", ":")).encode()) for kind, (path, body) in made.items()
    }


async def _small_latencies(
    client: httpx.AsyncClient, until: asyncio.Task[Any] | None, count: int
) -> list[float]:
    """Seconds each `GET /v1/models` took, sent one after another until `until` is done (or `count`)."""
    latencies: list[float] = []
    while (until is None and len(latencies) < count) or (until is not None and not until.done()):
        start = time.perf_counter()
        response = await client.get("/v1/models")
        response.raise_for_status()
        latencies.append(time.perf_counter() - start)
    return latencies


async def _post(client: httpx.AsyncClient, path: str, body: bytes) -> tuple[int, float]:
    start = time.perf_counter()
    response = await client.post(path, content=body, headers={"content-type": "application/json"})
    return response.status_code, time.perf_counter() - start


async def stall(base_url: str, path: str, body: bytes) -> dict[str, Any]:
    """One large request, and the small requests sent while it runs."""
    async with (
        httpx.AsyncClient(base_url=base_url, timeout=300) as big,
        httpx.AsyncClient(base_url=base_url, timeout=300) as small,
    ):
        large = asyncio.create_task(_post(big, path, body))
        latencies = await _small_latencies(small, large, 0)
        status, seconds = await large
    return {
        "status": status,
        "large_s": round(seconds, 3),
        "small_max_s": round(max(latencies), 3),
        "small_p50_s": round(statistics.median(latencies), 4),
        "num_small": len(latencies),
    }


class RssPeak:
    """Samples a process's RSS every 20 ms in a thread; `peak_mib` is the largest seen."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak_kib, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak_kib = max(self.peak_kib, rss_kib(self.pid))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return round(self.peak_kib / 1024, 1)


async def burst(base_url: str, made: dict[str, tuple[str, bytes]], num: int) -> list[int]:
    kinds = ["tokenize", "chat"]
    async with httpx.AsyncClient(
        base_url=base_url, timeout=600, limits=httpx.Limits(max_connections=num)
    ) as c:
        results = await asyncio.gather(*(_post(c, *made[kinds[i % 2]]) for i in range(num)))
    return sorted({status for status, _ in results})


def main() -> int:
    parser = stack_script_parser(__doc__)
    parser.add_argument("--mib", type=float, default=3.0, help="size of each large body, MiB")
    parser.add_argument("--burst", type=int, default=20, help="large requests sent at once")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds after the burst to read RSS again")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the gateway")
    args = parser.parse_args()
    gateway_env = dict(item.split("=", 1) for item in args.env)
    with tempfile.TemporaryDirectory() as tmp, redis_server(Path(tmp)) as url:
        stack = Stack(redis_url=url, model_dir=args.model, log_dir=Path(tmp))
        try:
            stack.start_gateway(**gateway_env)
            wait_for(lambda: stack.answers("/v1/models"), 60, "the gateway to answer")
            pid = stack.procs["gateway"].pid
            model = httpx.get(f"{stack.base_url}/v1/models").json()["data"][0]["id"]
            made = bodies(model, int(args.mib * 2**20))
            result: dict[str, Any] = {
                "mib": args.mib,
                "env": gateway_env,
                "rss_fresh_mib": round(rss_kib(pid) / 1024, 1),
            }

            async def quiet() -> list[float]:
                async with httpx.AsyncClient(base_url=stack.base_url) as client:
                    return await _small_latencies(client, None, 50)

            idle = asyncio.run(quiet())
            result["small_alone"] = {"p50_s": round(statistics.median(idle), 4), "max_s": round(max(idle), 4)}
            for kind, (path, body) in made.items():
                result[kind] = asyncio.run(stall(stack.base_url, path, body))
            result["rss_after_singles_mib"] = round(rss_kib(pid) / 1024, 1)
            sampler = RssPeak(pid)
            started = time.perf_counter()
            statuses = asyncio.run(burst(stack.base_url, made, args.burst))
            result["burst"] = {
                "num": args.burst,
                "statuses": statuses,
                "seconds": round(time.perf_counter() - started, 1),
                "rss_peak_mib": sampler.stop(),
                "rss_done_mib": round(rss_kib(pid) / 1024, 1),
            }
            time.sleep(args.idle)
            result["burst"]["rss_idle_mib"] = round(rss_kib(pid) / 1024, 1)
            stack.check_alive()
        finally:
            stack.stop()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
