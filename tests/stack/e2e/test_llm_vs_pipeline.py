"""`LLM` in this process answers as the served pipeline (HTTP -> Redis -> batcher -> worker) does:
the same greedy tokens, text and finish reasons, for the same completions (one long enough to be
prefilled in chunks, one cut by a stop string) and chats, on the shipped demo model (trained: its
answers end at EOS, its text is worth cutting)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cbserve import LLM, SamplingParams
from harness.processes.services import ROOT, Stack, module_stack

# (prompt, max_tokens, stop strings) of each completion; the last prompt is longer than the budget.
COMPLETIONS: list[tuple[str, int, list[str]]] = [
    ("The import statement", 48, []),
    ("A class definition", 32, []),
    ("The for statement", 40, [" (such", "tuple"]),
    ("def", 16, []),
    ("Python's documentation says: " + "the with statement wraps a block. " * 30, 24, []),
]
CHATS = [
    [{"role": "user", "content": "What is the assert statement?"}],
    [
        {"role": "system", "content": "You answer questions about Python."},
        {"role": "user", "content": "Explain the for statement."},
    ],
]
BUDGET = 64  # tokens per step, in the worker and here: the long prompt is prefilled in chunks


@pytest.fixture(scope="module")
def demo_model_dir() -> Path:
    return ROOT / "models" / "demo"


stack = module_stack(
    "llm-vs-pipeline", "demo_model_dir", worker_env={"WORKER_MAX_NUM_BATCHED_TOKENS": str(BUDGET)}
)


@pytest.fixture(scope="module")
def llm(demo_model_dir: Path) -> Iterator[LLM]:
    yield LLM(str(demo_model_dir), device="cpu", max_num_batched_tokens=BUDGET)


async def _post_all(base_url: str, path: str, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every body at once, so the pipeline batches them as LLM batches its prompts."""
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        answers = await asyncio.gather(*(client.post(path, json=body) for body in bodies))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    return [a.json()["choices"][0] for a in answers]


def served(stack: Stack, path: str, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    common = {"model": stack.model_dir.name, "temperature": 0, "return_token_ids": True}
    return asyncio.run(_post_all(stack.base_url, path, [{**common, **body} for body in bodies]))


def test_completions_equal_the_pipelines(stack: Stack, llm: LLM) -> None:
    bodies = [{"prompt": p, "max_tokens": m, "stop": s} for p, m, s in COMPLETIONS]
    expected = served(stack, "/v1/completions", bodies)
    params = [SamplingParams(temperature=0.0, max_tokens=m, stop=s) for _, m, s in COMPLETIONS]
    outputs = llm.generate([p for p, _, _ in COMPLETIONS], params, use_tqdm=False)
    got = [(o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason) for o in outputs]
    assert got == [(c["token_ids"], c["text"], c["finish_reason"]) for c in expected]
    assert outputs[2].outputs[0].stop_reason == " (such"  # the stop string met first cut it
    assert llm.llm_engine.stats.num_partial_prefills > 0


def test_chats_equal_the_pipelines(stack: Stack, llm: LLM) -> None:
    expected = served(stack, "/v1/chat/completions", [{"messages": m, "max_tokens": 48} for m in CHATS])
    outputs = llm.chat(CHATS, SamplingParams(temperature=0.0, max_tokens=48), use_tqdm=False)
    got = [(o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason) for o in outputs]
    assert got == [(c["token_ids"], c["message"]["content"], c["finish_reason"]) for c in expected]
    # The demo model ends its answers: at its end-of-turn token (EOS), which the text leaves out.
    assert all((o.outputs[0].finish_reason, o.outputs[0].stop_reason) == ("stop", None) for o in outputs)
