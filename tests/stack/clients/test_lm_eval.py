"""lm-eval itself: its `local-completions` model against the real stack scores a small multiple-choice
task exactly as its `hf` model (transformers) does, with `--batch_size` > 1.

lm-eval (`lm-eval[api,hf]`) is in the `dev` extra. It reads the task's data with `datasets` offline
(a local JSONL file), and builds the `hf` model from the tiny model's directory on the CPU.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import lm_eval
import pytest

from harness.gateway.sse_client import post_sse
from harness.processes.services import Stack, running_stack

TASK = "cbserve_tiny_mc"
GEN_TASK = "cbserve_tiny_gen"
# Questions in the tiny model's training text (standard-library docstrings), four choices each.
QUESTIONS = [
    ("Return a new", [" dictionary", " object", " list", " string"], 1),
    ("Raise ValueError if the", [" value", " file", " path", " key"], 0),
    ("The optional argument", [" is", " must", " can", " will"], 0),
    ("If the path is", [" absolute", " empty", " a", " not"], 2),
    ("Return the number of", [" bytes", " items", " elements", " characters"], 1),
    ("This is the", [" default", " same", " first", " name"], 1),
]


@pytest.fixture(scope="module")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    worker_env = {"WORKER_MAX_NUM_BATCHED_TOKENS": "16", "WORKER_MAX_NUM_SEQS": "8"}
    with running_stack(
        tmp_path_factory.mktemp("lm-eval-stack"), tiny_model_dir, worker_env=worker_env
    ) as stack:
        yield stack


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("lm-eval-task")
    data = path / "data.jsonl"
    data.write_text(
        "".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in QUESTIONS)
    )
    (path / f"{TASK}.yaml").write_text(
        f"task: {TASK}\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\n'
        'doc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{answer}}"\n'
        "metric_list:\n  - metric: acc\n"
    )
    # The same questions as a generation task, for the chat model (it generates; it cannot score).
    (path / f"{GEN_TASK}.yaml").write_text(
        f"task: {GEN_TASK}\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: generate_until\n"
        'doc_to_text: "{{question}}"\n'
        'doc_to_target: "{{choices[answer]}}"\n'
        "generation_kwargs:\n  until: ['\\n']\n  max_gen_toks: 8\n"
        "metric_list:\n  - metric: exact_match\n"
    )
    return path


def evaluate(model: str, model_args: str, task_dir: Path, task: str = TASK, **options: Any) -> dict[str, Any]:
    from lm_eval.tasks import TaskManager  # here, not at the top: it imports datasets (3 s) on collection

    result = lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=[task],
        task_manager=TaskManager(include_path=str(task_dir)),
        batch_size=4,
        log_samples=True,
        device="cpu",
        **options,
    )
    assert result is not None
    return result


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path, task_dir: Path) -> dict[str, Any]:
    """lm-eval's `hf` model on the same weights: the scores every served run must give."""
    return evaluate("hf", f"pretrained={tiny_model_dir},dtype=float32", task_dir)


def assert_scores_as(served: dict[str, Any], reference: dict[str, Any]) -> None:
    served_samples = sorted(served["samples"][TASK], key=lambda s: s["doc_id"])
    reference_samples = sorted(reference["samples"][TASK], key=lambda s: s["doc_id"])
    assert len(served_samples) == len(QUESTIONS)
    for mine, theirs in zip(served_samples, reference_samples, strict=True):
        scores = [float(r[0][0]) for r in mine["resps"]]
        expected = [float(r[0][0]) for r in theirs["resps"]]
        assert len(set(expected)) > 1, "choices the model tells apart"
        assert scores == pytest.approx(expected, abs=1e-3), mine["doc"]
        assert [r[0][1] for r in mine["resps"]] == [r[0][1] for r in theirs["resps"]]  # is_greedy
    assert served["results"][TASK]["acc,none"] == reference["results"][TASK]["acc,none"]


@pytest.fixture()
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.mark.usefixtures("offline")
def test_local_completions_scores_as_transformers(
    stack: Stack, tiny_model_dir: Path, task_dir: Path, reference: dict[str, Any]
) -> None:
    served = evaluate(
        "local-completions",
        f"model={tiny_model_dir.name},base_url={stack.base_url}/v1/completions,"
        f"tokenizer={tiny_model_dir},tokenizer_backend=huggingface,tokenized_requests=True,num_concurrent=1",
        task_dir,
    )
    assert_scores_as(served, reference)


@pytest.mark.usefixtures("offline")
def test_local_completions_with_only_model_and_base_url(
    stack: Stack, tiny_model_dir: Path, task_dir: Path, reference: dict[str, Any]
) -> None:
    """Zero configuration, offline: lm-eval finds /tokenizer_info and /tokenize and tokenizes through
    the server (its remote tokenizer) instead of asking the hub for a model named like ours."""
    served = evaluate(
        "local-completions", f"model={tiny_model_dir.name},base_url={stack.base_url}/v1/completions", task_dir
    )
    assert_scores_as(served, reference)


@pytest.mark.usefixtures("offline")
def test_local_chat_completions_with_only_model_and_base_url(
    stack: Stack, tiny_model_dir: Path, task_dir: Path
) -> None:
    """lm-eval's chat model, zero configuration: every question answered through /v1/chat/completions."""
    result = evaluate(
        "local-chat-completions",
        f"model={tiny_model_dir.name},base_url={stack.base_url}/v1/chat/completions",
        task_dir,
        GEN_TASK,
        apply_chat_template=True,
    )
    samples = result["samples"][GEN_TASK]
    assert len(samples) == len(QUESTIONS)
    assert all(isinstance(s["resps"][0][0], str) for s in samples)
    assert "exact_match,none" in result["results"][GEN_TASK]


# guidellm's default streaming bodies (its text- and chat-completions handlers): usage on every chunk,
# so it times each token; output of a fixed length (ignore_eos), stop strings off with a null.
GUIDELLM_STREAM = {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
GUIDELLM_BODIES = {
    "/v1/completions": {"prompt": "Return the value of the", "max_tokens": 8},
    "/v1/chat/completions": {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Return the value of the"}]}],
        "max_completion_tokens": 8,
    },
}


@pytest.mark.parametrize("path", list(GUIDELLM_BODIES))
def test_guidellm_streaming_request(stack: Stack, tiny_model_dir: Path, path: str) -> None:
    body = {
        "model": tiny_model_dir.name,
        **GUIDELLM_BODIES[path],
        "stop": None,
        "ignore_eos": True,
        **GUIDELLM_STREAM,
    }
    with httpx.Client(base_url=stack.base_url, timeout=60) as client:
        response, events = post_sse(client, path, body)
    assert response.status_code == 200
    chunks = [e.json() for e in events if e.data != "[DONE]"]
    assert all(c["usage"] is not None for c in chunks)
    assert chunks[-1]["usage"]["completion_tokens"] == 8
    text_of = (
        (lambda c: c["text"]) if path == "/v1/completions" else (lambda c: c["delta"].get("content", ""))
    )
    assert "".join(text_of(c["choices"][0]) for c in chunks if c["choices"])
