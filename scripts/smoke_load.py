"""A rough load check (not the benchmark tool): N concurrent greedy completions, output tokens/s.

python scripts/smoke_load.py --base-url http://127.0.0.1:8000 --requests 32 --max-tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx


async def one(client: httpx.AsyncClient, prompt: list[int], max_tokens: int) -> int:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    resp = await client.post("/v1/completions", json=body)
    resp.raise_for_status()
    return int(resp.json()["usage"]["completion_tokens"])


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    prompts = [[10 + (i * 7 + j) % 300 for j in range(args.prompt_len)] for i in range(args.requests)]
    async with httpx.AsyncClient(base_url=args.base_url, timeout=600) as client:
        start = time.perf_counter()
        counts = await asyncio.gather(*(one(client, p, args.max_tokens) for p in prompts))
        elapsed = time.perf_counter() - start
    total = sum(counts)
    rate = total / elapsed
    print(f"{args.requests} requests, {total} output tokens in {elapsed:.2f} s: {rate:.0f} tokens/s")


if __name__ == "__main__":
    asyncio.run(main())
