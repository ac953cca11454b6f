"""Take the dashboard screenshot in docs/img/dashboard.png from a running server under real load.

    export BATCHER_MAX_NUM_BATCHED_TOKENS=64 BATCHER_MAX_NUM_SEQS=16 WORKER_NUM_BLOCKS=160
    make run ARGS="--workers 2"                                                   # terminal 1
    .venv/bin/python -m scripts.dashboard_screenshot --out docs/img/dashboard.png  # terminal 2

(A small token budget shows prefill chunks, a small KV pool a KV bar that moves.)

It opens /dashboard in headless Chromium (harness/user/browser.py), sends a stream of chat and completion
requests of different lengths arriving at random (so requests join and leave the batch at different
steps), asks the playground a question, and photographs the page once the answer is complete while
the load still runs.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import threading
from pathlib import Path
from typing import Any

import httpx

from harness.user.browser import chromium

QUESTIONS = [
    "What is the assert statement?",
    "Explain the for statement.",
    "What is the with statement?",
    "What does the yield expression do?",
    "What is a generator?",
    "Explain the import statement.",
]
TEXTS = ["The import statement", "The for loop", "Python is", "A class definition", "The try statement"]


def _body(rng: random.Random) -> tuple[str, dict[str, Any]]:
    if rng.random() < 0.5:
        question = rng.choice(QUESTIONS)
        return "/v1/chat/completions", {
            "messages": [{"role": "user", "content": question}],
            "max_tokens": 96,
            "temperature": 0.8,
        }
    # Completions past EOS keep a request in the batch for a chosen number of steps.
    prompt = " ".join(rng.choice(TEXTS) for _ in range(rng.randint(1, 12)))
    return "/v1/completions", {
        "prompt": prompt,
        "max_tokens": rng.randint(40, 200),
        "temperature": 0.8,
        "ignore_eos": True,
    }


async def _load(
    base_url: str, headers: dict[str, str], seconds: float, rate: float, stop: threading.Event
) -> None:
    rng = random.Random(7)
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=300) as client:
        tasks: list[asyncio.Task[httpx.Response]] = []
        while loop.time() < end and not stop.is_set():
            path, body = _body(rng)
            tasks.append(asyncio.create_task(client.post(path, json=body)))
            await asyncio.sleep(rng.expovariate(rate))  # Poisson arrivals
        for response in await asyncio.gather(*tasks):
            response.raise_for_status()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--api-key", default="")
    parser.add_argument("--out", type=Path, default=Path("docs/img/dashboard.png"))
    parser.add_argument("--rate", type=float, default=10.0, help="requests per second")
    parser.add_argument("--seconds", type=float, default=40.0, help="how long the load runs at most")
    args = parser.parse_args()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}

    stop = threading.Event()
    load = threading.Thread(
        target=asyncio.run, args=(_load(args.base_url, headers, args.seconds, args.rate, stop),)
    )
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 700})
        page.goto(f"{args.base_url}/dashboard")
        if args.api_key:
            page.get_by_test_id("api-key").fill(args.api_key)
            page.get_by_text("Use key").click()
        page.wait_for_selector('[data-testid="connection"][data-state="live"]', timeout=30_000)
        load.start()
        # Let the batch fill up before the playground's request joins it.
        page.wait_for_function(
            "() => document.querySelectorAll('[data-testid=\"batch-cell\"]').length > 1000", timeout=120_000
        )
        page.get_by_test_id("prompt").fill(QUESTIONS[0])
        page.get_by_test_id("send").click()
        page.wait_for_selector('[data-testid="playground-status"][data-state="done"]', timeout=120_000)
        page.get_by_test_id("pause").click()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(args.out), full_page=True)
        stop.set()
    load.join()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
