"""What evaluation harnesses and older clients send, through the real stack and the `openai` SDK.

Loglikelihoods are scored exactly as lm-eval's `local-completions` model scores them (a batch of
token-id prompts, `echo`, `logprobs=1`, `max_tokens=1`, `temperature=0`, then the sum of
`token_logprobs[ctxlen:-1]` per choice sorted by index), and must equal transformers' own
log_softmax over the same tokens (what `lm_eval --model hf` computes). The worker computes prompts
in chunks of a few tokens, so a prompt's logprobs come from several prefill steps.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from harness.processes.services import Stack, module_stack

TOL = 1e-3  # fp32 on both sides; sums over a few tokens
_rng = random.Random(16)
CONTEXTS = [[_rng.randrange(3, 500) for _ in range(n)] for n in (21, 9, 30)]
CHOICES = [[_rng.randrange(3, 500) for _ in range(n)] for n in (1, 3, 5)]


# Small chunks and blocks: prompts span several prefill steps and cached blocks.
stack = module_stack(
    "eval-stack",
    worker_env={"WORKER_MAX_NUM_BATCHED_TOKENS": "8", "WORKER_MAX_NUM_SEQS": "8", "WORKER_BLOCK_SIZE": "4"},
)


@pytest.fixture(scope="module")
def http(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.base_url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> Any:
    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def hf_logprobs(model: Any, tokens: list[int]) -> torch.Tensor:
    """log P(tokens[i] | tokens[:i]) for i >= 1, from one plain forward (lm-eval's hf model)."""
    with torch.inference_mode():
        logits = model(torch.tensor([tokens])).logits[0].float()
    return logits.log_softmax(-1)[:-1].gather(1, torch.tensor(tokens[1:]).unsqueeze(1)).squeeze(1)


def hf_loglikelihood(model: Any, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    with torch.inference_mode():
        logits = model(torch.tensor([context + continuation])).logits[0].float()
    logprobs = logits.log_softmax(-1)[len(context) - 1 : -1]
    target = torch.tensor(continuation)
    greedy = bool((logprobs.argmax(-1) == target).all())
    return float(logprobs.gather(1, target.unsqueeze(1)).sum()), greedy


def complete(
    client: openai.OpenAI, prompt: str | list[str] | list[int] | list[list[int]], **params: Any
) -> Any:
    """A completion that names no model (`model` null): the gateway answers with the one it serves."""
    return client.completions.create(model="", prompt=prompt, extra_body={"model": None}, **params)


def lm_eval_loglikelihoods(
    client: openai.OpenAI, requests: list[tuple[list[int], list[int]]], max_tokens: int = 1
) -> list[tuple[float, bool]]:
    """lm-eval's LocalCompletionsAPI: _create_payload(generate=False) and parse_logprobs."""
    prompts = [context + continuation for context, continuation in requests]
    out = complete(
        client, prompts, temperature=0, max_tokens=max_tokens, logprobs=1, seed=1234, echo=True
    ).model_dump()
    results = []
    drop = -1 if max_tokens else None  # lm-eval drops the generated token; max_tokens 0 has none
    for choice, (context, _) in zip(sorted(out["choices"], key=lambda c: c["index"]), requests, strict=True):
        ctxlen = len(context)
        token_logprobs = choice["logprobs"]["token_logprobs"][ctxlen:drop]
        top_logprobs = choice["logprobs"]["top_logprobs"][ctxlen:drop]
        greedy = all(tok == max(top.values()) for tok, top in zip(token_logprobs, top_logprobs, strict=True))
        results.append((sum(token_logprobs), greedy))
    return results


@pytest.mark.parametrize("max_tokens", [1, 0], ids=["lm-eval-max_tokens-1", "max_tokens-0"])
def test_multiple_choice_loglikelihoods_equal_transformers(
    client: openai.OpenAI, model: Any, max_tokens: int
) -> None:
    # A small multiple-choice task: each context with each continuation, batched as lm-eval does.
    requests = [(context, choice) for context in CONTEXTS for choice in CHOICES]
    served = lm_eval_loglikelihoods(client, requests, max_tokens)
    for (context, choice), (logprob, greedy) in zip(requests, served, strict=True):
        ref_logprob, ref_greedy = hf_loglikelihood(model, context, choice)
        assert logprob == pytest.approx(ref_logprob, abs=TOL)
        assert greedy == ref_greedy
    # The answer each question picks (argmax over its choices) is transformers' too.
    for q in range(len(CONTEXTS)):
        scores = [served[q * len(CHOICES) + c][0] for c in range(len(CHOICES))]
        refs = [hf_loglikelihood(model, CONTEXTS[q], c)[0] for c in CHOICES]
        assert scores.index(max(scores)) == refs.index(max(refs))


def test_echo_with_logprobs_returns_the_prompt_tokens_first(client: openai.OpenAI, model: Any) -> None:
    prompt = CONTEXTS[2]
    out = complete(client, prompt, max_tokens=3, logprobs=2, echo=True, temperature=0)
    choice = out.choices[0]
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.token_logprobs is not None and logprobs.top_logprobs is not None
    assert len(logprobs.token_logprobs) == len(prompt) + 3
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    served = torch.tensor(logprobs.token_logprobs[1 : len(prompt)])
    torch.testing.assert_close(served, hf_logprobs(model, prompt), atol=TOL, rtol=0)
    assert all(len(top) <= 2 for top in logprobs.top_logprobs[1:] if top is not None)
    # text_offset counts through the echoed prompt, then the output.
    assert logprobs.text_offset is not None and logprobs.tokens is not None
    assert logprobs.text_offset[0] == 0
    assert all(b >= a for a, b in zip(logprobs.text_offset, logprobs.text_offset[1:], strict=False))
    assert out.usage is not None and out.usage.completion_tokens == 3
    assert out.usage.prompt_tokens == len(prompt)


def test_max_tokens_zero_scores_without_generating(client: openai.OpenAI, model: Any) -> None:
    prompt = "The cat sat on the mat and looked at the door."
    out = complete(client, prompt, max_tokens=0, logprobs=0, echo=True)
    choice = out.choices[0]
    assert choice.text == prompt
    assert choice.finish_reason == "length"
    assert out.usage is not None and out.usage.completion_tokens == 0
    assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
    assert len(choice.logprobs.token_logprobs) == out.usage.prompt_tokens
    assert choice.logprobs.top_logprobs is not None and choice.logprobs.top_logprobs[1] == {}
    # Without echo, an empty choice.
    plain = complete(client, prompt, max_tokens=0)
    assert plain.choices[0].text == "" and plain.choices[0].finish_reason == "length"
    assert plain.usage is not None and plain.usage.completion_tokens == 0


def test_prompt_logprobs_ignore_the_prefix_cache(client: openai.OpenAI, model: Any) -> None:
    """A prompt whose blocks are cached is computed whole anyway when its logprobs are asked."""
    prompt = CONTEXTS[0] + CHOICES[2]
    warm = complete(client, prompt, max_tokens=1)
    again = complete(client, prompt, max_tokens=1)
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens > 0, "the prefix cache holds the prompt"
    assert warm.usage is not None
    scored = complete(client, prompt, max_tokens=0, logprobs=1, echo=True)
    assert scored.usage is not None and scored.usage.prompt_tokens_details is not None
    assert scored.usage.prompt_tokens_details.cached_tokens == 0
    logprobs = scored.choices[0].logprobs
    assert logprobs is not None and logprobs.token_logprobs is not None
    torch.testing.assert_close(
        torch.tensor(logprobs.token_logprobs[1:]), hf_logprobs(model, prompt), atol=TOL, rtol=0
    )


def test_streamed_echo_carries_the_prompt_logprobs(client: openai.OpenAI, model: Any) -> None:
    prompt = CONTEXTS[1]
    stream = complete(client, prompt, max_tokens=2, logprobs=1, echo=True, temperature=0, stream=True)
    chunks = list(stream)
    token_logprobs: list[float | None] = []
    for chunk in chunks:
        for choice in chunk.choices:
            if choice.logprobs is not None and choice.logprobs.token_logprobs is not None:
                token_logprobs += choice.logprobs.token_logprobs
    assert len(token_logprobs) == len(prompt) + 2
    assert token_logprobs[0] is None
    served = torch.tensor(token_logprobs[1 : len(prompt)])
    torch.testing.assert_close(served, hf_logprobs(model, prompt), atol=TOL, rtol=0)


def test_a_list_of_prompts_with_n_answers_each(client: openai.OpenAI, model: Any) -> None:
    prompts = ["Return the value", "The object", "A cat"]
    out = complete(client, prompts, n=2, max_tokens=4, temperature=0, echo=True)
    assert sorted(c.index for c in out.choices) == list(range(6))
    by_index = {c.index: c for c in out.choices}
    for p, prompt in enumerate(prompts):
        first, second = by_index[2 * p], by_index[2 * p + 1]
        assert first.text.startswith(prompt) and first.text == second.text  # greedy: equal choices
        alone = complete(client, prompt, max_tokens=4, temperature=0)
        assert first.text == prompt + alone.choices[0].text
        assert alone.usage is not None
    token_prompts = [CONTEXTS[1], CONTEXTS[0]]
    ids = client.completions.create(
        model="",
        prompt=token_prompts,
        max_tokens=2,
        temperature=0,
        extra_body={"model": None, "return_token_ids": True},
    )
    assert ids.usage is not None
    assert ids.usage.prompt_tokens == sum(len(p) for p in token_prompts)
    num_output = [len((c.model_extra or {})["token_ids"]) for c in ids.choices]
    assert ids.usage.completion_tokens == sum(num_output)
    assert out.usage is not None and out.usage.completion_tokens == 6 * 4


def test_streamed_list_of_prompts(http: httpx.Client) -> None:
    body = {"prompt": ["one", "two"], "max_tokens": 2, "stream": True, "temperature": 0, "n": 2}
    with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: {")]
    indexes = {c["index"] for line in lines for c in httpx.Response(200, content=line[6:]).json()["choices"]}
    assert indexes == {0, 1, 2, 3}


def test_model_by_id_and_openai_errors_for_unknown_paths(
    client: openai.OpenAI, http: httpx.Client, stack: Stack
) -> None:
    name = client.models.list().data[0].id
    card = client.models.retrieve(name)
    assert card.id == name and card.object == "model"
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4")
    assert missing.value.code == "model_not_found"
    for method, path in (
        ("POST", "/v1/audio/speech"),
        ("GET", "/v1/nothing/here"),
        ("POST", "/v1/moderations"),
    ):
        response = http.request(method, path, json={})
        assert response.status_code == 404
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "not_found"
        assert path in error["message"]
    # Served by pooling models: a generation model says it is not one (docs/api.md).
    with pytest.raises(openai.BadRequestError, match="does not serve embeddings: embed requests"):
        client.embeddings.create(model=name, input="hi")
    wrong = http.get("/v1/completions")
    assert wrong.status_code == 405
    assert wrong.json()["error"]["code"] == "method_not_allowed"
    assert "/v1/completions" in wrong.json()["error"]["message"]


def test_developer_role_reads_as_system(client: openai.OpenAI, http: httpx.Client) -> None:
    """ChatML renders the role name as it is: a developer message is shown to the model as system."""

    def answer(role: str) -> Any:
        body = {
            "messages": [{"role": role, "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            "max_tokens": 3,
            "temperature": 0,
            "return_token_ids": True,
        }
        response = http.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        return response.json()

    developer, system = answer("developer"), answer("system")
    assert developer["usage"]["prompt_tokens"] == system["usage"]["prompt_tokens"]
    assert developer["choices"][0]["token_ids"] == system["choices"][0]["token_ids"]
    sdk = client.chat.completions.create(
        model="",
        messages=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        max_tokens=2,
        extra_body={"model": None},
    )
    assert sdk.choices[0].message.role == "assistant"
