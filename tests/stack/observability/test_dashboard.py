"""The dashboard in a real headless Chromium against real processes: the playground streams tokens,
and the batch view draws continuous batching as it happens (a request joining a batch mid-decode).

A screenshot is kept in the artefact directory (harness/user/browser.py: `CBSERVE_TEST_ARTIFACTS`, default
`test-artifacts/`) for a person to look at.
"""

from __future__ import annotations

import struct
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from playwright.sync_api import Page, expect

from harness.processes.services import Stack
from harness.user.browser import artifact_dir, chromium

BUDGET = 16  # BATCHER_MAX_NUM_BATCHED_TOKENS: prompts longer than this are prefilled in chunks
PROMPT = "Tell me about the with statement."
MAX_TOKENS = 24
NUM_BACKGROUND = 3
TIMEOUT_MS = 30_000

# True once some step holds a prefill chunk of the playground's request beside another request's
# decode: a request joining a batch that is mid-decode, the picture continuous batching is about.
JOINED_MID_DECODE = """() => {
  const mine = document.querySelector('[data-testid="playground-request"]').textContent;
  const steps = new Map();
  for (const cell of document.querySelectorAll('[data-testid="batch-cell"]')) {
    const step = steps.get(cell.dataset.step) || [];
    step.push(cell.dataset);
    steps.set(cell.dataset.step, step);
  }
  return mine !== "" && [...steps.values()].some((cells) =>
    cells.some((c) => c.req === mine && c.kind === "prefill") &&
    cells.some((c) => c.req !== mine && c.kind === "decode"));
}"""


@contextmanager
def background_requests(base_url: str, num: int) -> Iterator[list[threading.Thread]]:
    """`num` long completions, each sent once the one before has its first token (so each joins a
    running batch); yields when all of them are decoding."""
    threads: list[threading.Thread] = []
    errors: list[BaseException] = []
    for i in range(num):
        first_token = threading.Event()
        body = {
            "prompt": list(range(10 + i, 10 + i + 20 + 9 * i)),  # 20, 29, 38 tokens: 2 or 3 chunks
            # As long as the tiny model's 512 tokens allow: they must still decode when the playground's
            # request is prefilled (at 200 they had finished first on a fast host).
            "max_tokens": 460,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }

        def run(body: dict[str, Any] = body, first_token: threading.Event = first_token) -> None:
            try:
                with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=120) as r:
                    assert r.status_code == 200, r.read()
                    for line in r.iter_lines():
                        if line.startswith("data: {"):
                            first_token.set()
            except BaseException as exc:
                errors.append(exc)
                first_token.set()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        threads.append(thread)
        assert first_token.wait(60), "a background request got no token"
        assert not errors, errors
    try:
        yield threads
    finally:
        for thread in threads:
            thread.join(timeout=120)
        assert not errors, errors


def _cells(page: Page) -> list[dict[str, str]]:
    cells: list[dict[str, str]] = page.eval_on_selector_all(
        '[data-testid="batch-cell"]', "cells => cells.map(c => ({...c.dataset}))"
    )
    return cells


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_playground_streams_and_the_batch_view_follows(make_stack: Callable[[], Stack]) -> None:
    stack = make_stack().start_all(
        batcher_env={"BATCHER_MAX_NUM_SEQS": "8", "BATCHER_MAX_NUM_BATCHED_TOKENS": str(BUDGET)}
    )

    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page_errors: list[str] = []
        page.on("pageerror", lambda exc: page_errors.append(str(exc)))
        page.on("console", lambda msg: page_errors.append(msg.text) if msg.type == "error" else None)
        page.goto(f"{stack.base_url}/dashboard")
        expect(page.get_by_test_id("connection")).to_have_attribute("data-state", "live", timeout=TIMEOUT_MS)
        expect(page.get_by_test_id("worker")).to_have_count(1, timeout=TIMEOUT_MS)  # from the stats events
        expect(page.get_by_test_id("model")).to_have_text(f"model: {stack.model_dir.name}")

        with background_requests(stack.base_url, NUM_BACKGROUND):
            page.get_by_test_id("prompt").fill(PROMPT)
            page.get_by_test_id("max-tokens").fill(str(MAX_TOKENS))
            page.get_by_test_id("send").click()
            page.wait_for_function(JOINED_MID_DECODE, timeout=TIMEOUT_MS, polling="raf")
            page.get_by_test_id("pause").click()  # hold the picture still to check it and photograph it

            cells = _cells(page)
            mine = page.get_by_test_id("playground-request").text_content()
            by_step: dict[str, list[dict[str, str]]] = defaultdict(list)
            for cell in cells:
                by_step[cell["step"]].append(cell)
            assert {c["kind"] for c in cells} >= {"prefill", "decode"}
            assert {c["req"] for c in cells} >= {mine} and len({c["req"] for c in cells}) > 1
            assert max(len(step) for step in by_step.values()) >= 2  # a step held several requests
            assert all(c["tokens"] == "1" for c in cells if c["kind"] == "decode")
            assert all(0 < int(c["tokens"]) <= BUDGET for c in cells if c["kind"] == "prefill")
            kv = page.get_by_test_id("kv-bar")
            assert (
                int(kv.get_attribute("data-used") or 0) > 0 and int(kv.get_attribute("data-total") or 0) > 0
            )
            assert (kv.get_attribute("data-cached") or "").isdigit()  # free blocks holding prefixes
            assert float(page.get_by_test_id("computed-rate").text_content() or 0) > 0
            expect(page.get_by_test_id("output")).not_to_be_empty(timeout=TIMEOUT_MS)  # tokens stream in

            shot = artifact_dir() / "dashboard.png"
            shot.unlink(missing_ok=True)
            page.screenshot(path=str(shot), full_page=True)
            page.get_by_test_id("pause").click()

        status = page.get_by_test_id("playground-status")
        expect(status).to_have_attribute("data-state", "done", timeout=TIMEOUT_MS)
        shown = page.get_by_test_id("output").text_content()
        status_text = status.text_content() or ""

    # The playground showed exactly what the API answers for the same greedy request.
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": MAX_TOKENS, "temperature": 0}
    answer = httpx.post(f"{stack.base_url}/v1/chat/completions", json=body, timeout=60).json()
    assert shown and shown == answer["choices"][0]["message"]["content"]
    assert status_text.startswith(f"{answer['usage']['completion_tokens']} tokens")
    assert not page_errors, page_errors

    data = shot.read_bytes()
    width, height = _png_size(data)
    assert width == 1400 and height >= 900 and len(data) > 20_000
