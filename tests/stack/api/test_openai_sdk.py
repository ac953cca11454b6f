"""The real `openai` SDK against the real stack (uvicorn gateway, Redis, batcher, worker, tiny model).

The SDK's own parsing must accept every response and chunk; each sampling parameter is checked by
its effect, against references computed with transformers on the same model where one exists.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import redis
import torch
from openai.types import CompletionUsage
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

from common.protocol import FIELD, decode_request
from common.streams import REQUESTS_STREAM
from harness.models.tiny_model import byte_token_id
from harness.processes.services import Stack, running_stack
from tests.unit.gpu_worker.test_model_runner import EOS_PROMPT

PROMPT = [random.Random(7).randrange(3, 500) for _ in range(12)]
USER = [{"role": "user", "content": "Return the value of the object."}]


@pytest.fixture(scope="module")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("sdk-stack"), tiny_model_dir) as stack:
        yield stack


@pytest.fixture(scope="module")
def model_name(tiny_model_dir: Path) -> str:
    return tiny_model_dir.name


@pytest.fixture(scope="module")
def client(stack: Stack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", timeout=120, max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> Any:
    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def reference(
    model: Any, prompt: list[int], max_tokens: int, *, rep: float = 1.0, freq: float = 0.0, pres: float = 0.0
) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens with the penalties applied by hand to plain forward logits, and each position's
    raw log-softmax (what logprobs must equal)."""
    ids, out, logprobs = list(prompt), [], []
    for _ in range(max_tokens):
        with torch.inference_mode():
            logits = model(torch.tensor([ids])).logits[0, -1].float()
        logprobs.append(logits.log_softmax(-1))
        edited = logits.clone()
        for t in set(ids):
            edited[t] = edited[t] / rep if edited[t] > 0 else edited[t] * rep
        for t in set(out):
            edited[t] -= freq * out.count(t) + pres
        token = int(edited.argmax())
        ids.append(token)
        out.append(token)
    return out, logprobs


def token_ids(choice: Any) -> list[int]:
    return list(choice.model_extra["token_ids"])


def complete(client: openai.OpenAI, model_name: str, **kwargs: Any) -> Any:
    extra = {"ignore_eos": True, "return_token_ids": True, **kwargs.pop("extra_body", {})}
    args: dict[str, Any] = {"prompt": PROMPT, "max_tokens": 10, "temperature": 0, **kwargs}
    return client.completions.create(model=model_name, extra_body=extra, **args)


# ---- the SDK parses everything ------------------------------------------------------------------


def test_sdk_completions_plain_and_streaming(client: openai.OpenAI, model_name: str) -> None:
    # One greedy request, whole and streamed twice: the same text and usage each time.
    request: dict[str, Any] = {"model": model_name, "prompt": "Return the", "max_tokens": 8, "temperature": 0}
    done = client.completions.create(**request)
    assert done.object == "text_completion" and len(done.choices) == 1
    assert done.choices[0].finish_reason in ("stop", "length") and done.choices[0].text
    assert done.usage is not None and done.usage.completion_tokens >= 1
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens

    chunks = list(client.completions.create(**request, stream=True))
    assert all(c.usage is None for c in chunks)  # not asked for
    assert "".join(c.choices[0].text for c in chunks if c.choices) == done.choices[0].text

    with_usage = list(
        client.completions.create(**request, stream=True, stream_options={"include_usage": True})
    )
    assert with_usage[-1].choices == [] and counts(with_usage[-1].usage) == counts(done.usage)
    assert all(c.usage is None for c in with_usage[:-1])


def counts(usage: CompletionUsage | None) -> tuple[int, int, int]:
    """Usage less its cached tokens: a repeated prompt finds the first one's blocks cached."""
    assert usage is not None
    return usage.prompt_tokens, usage.completion_tokens, usage.total_tokens


def test_sdk_chat_plain_and_streaming(client: openai.OpenAI, model_name: str) -> None:
    done = client.chat.completions.create(
        model=model_name,
        messages=USER,
        max_completion_tokens=6,
        temperature=0,
        user="alice",  # type: ignore[arg-type]
    )
    assert done.object == "chat.completion"
    assert done.choices[0].message.role == "assistant" and done.choices[0].message.content is not None
    assert done.usage is not None and done.usage.completion_tokens <= 6

    stream = client.chat.completions.create(
        model=model_name,
        messages=USER,  # type: ignore[arg-type]
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == done.choices[0].message.content
    assert counts(chunks[-1].usage) == counts(done.usage)


def test_async_sdk_streams_several_choices_at_once(stack: Stack, model_name: str) -> None:
    async def run() -> None:
        async with openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key="x", max_retries=0) as client:
            chat, completion = await asyncio.gather(
                client.chat.completions.create(
                    model=model_name,
                    messages=USER,  # type: ignore[arg-type]
                    max_tokens=5,
                    temperature=1.0,
                    seed=3,
                    n=2,
                    logprobs=True,
                    top_logprobs=2,
                    stream=True,
                ),
                client.completions.create(
                    model=model_name,
                    prompt="Return the",
                    max_tokens=5,
                    temperature=0,
                    stream=True,
                    logprobs=1,
                ),
            )
            chat_chunks = [c async for c in chat]
            completion_chunks = [c async for c in completion]
        finishes = {c.choices[0].index for c in chat_chunks if c.choices and c.choices[0].finish_reason}
        assert finishes == {0, 1}
        for chunk in chat_chunks:
            for choice in chunk.choices:
                if choice.logprobs is not None and choice.logprobs.content:
                    assert all(len(entry.top_logprobs) == 2 for entry in choice.logprobs.content)
        logprob_tokens = [t for c in completion_chunks for t in (c.choices[0].logprobs.tokens or [])]  # type: ignore[union-attr]
        assert len(logprob_tokens) == 5

    asyncio.run(run())


# ---- each parameter by its effect ---------------------------------------------------------------


def test_greedy_tokens_and_logprobs_match_transformers(
    client: openai.OpenAI, model_name: str, model: Any, tiny_model_dir: Path
) -> None:
    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    expected, ref_logprobs = reference(model, PROMPT, 10)
    done = complete(client, model_name, logprobs=3)
    choice = done.choices[0]
    assert token_ids(choice) == expected
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.token_logprobs is not None and logprobs.top_logprobs is not None
    for position, (token, got) in enumerate(zip(expected, logprobs.token_logprobs, strict=True)):
        assert got == pytest.approx(float(ref_logprobs[position][token]), abs=1e-4)
        top = ref_logprobs[position].topk(3)
        # Keyed by token text, built as the gateway builds it (two tokens may share a text).
        ref_top = {
            tok.decode([t], skip_special_tokens=False): lp
            for t, lp in zip(top.indices.tolist(), top.values.tolist(), strict=True)
        }
        assert logprobs.top_logprobs[position] == pytest.approx(ref_top, abs=1e-4)
    assert logprobs.text_offset is not None and logprobs.text_offset[0] == 0
    # One entry per generated token (a trailing partial UTF-8 character is never shown as text).
    assert logprobs.tokens is not None and len(logprobs.tokens) == len(expected)

    chat = client.chat.completions.create(
        model=model_name,
        messages=USER,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,  # type: ignore[arg-type]
    )
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == chat.usage.completion_tokens  # type: ignore[union-attr]
    for entry in content:
        # Greedy picks the most likely token; its bytes are its text's UTF-8.
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-6)
        assert entry.bytes == list(entry.token.encode())


def test_logit_bias_forces_a_token(client: openai.OpenAI, model_name: str) -> None:
    done = complete(client, model_name, temperature=1.0, seed=1, logit_bias={"300": 100}, max_tokens=6)
    assert token_ids(done.choices[0]) == [300] * 6
    plain = token_ids(complete(client, model_name).choices[0])
    banned = complete(client, model_name, logit_bias={str(plain[0]): -100})
    assert token_ids(banned.choices[0])[0] != plain[0]


def test_text_is_the_decoded_tokens_when_the_output_ends_mid_character(
    client: openai.OpenAI, model_name: str, tiny_model_dir: Path
) -> None:
    """A model made to emit only UTF-8 lead bytes (0xE2: a 3-byte character that never completes):
    streamed deltas, the whole text and decode(token_ids) are the same string, completions and chat."""
    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    lead = byte_token_id(tokenizer, 0xE2)
    forced: dict[str, Any] = {"max_tokens": 4, "temperature": 0, "logit_bias": {str(lead): 100}}
    extra = {"ignore_eos": True, "return_token_ids": True}
    done = complete(client, model_name, **forced)
    assert token_ids(done.choices[0]) == [lead] * 4
    expected = tokenizer.decode([lead] * 4, skip_special_tokens=True)
    assert expected == "\ufffd" * 4 and done.choices[0].text == expected
    stream = client.completions.create(
        model=model_name, prompt=PROMPT, stream=True, extra_body=extra, **forced
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == expected

    chat = client.chat.completions.create(
        model=model_name,
        messages=USER,  # type: ignore[arg-type]
        extra_body=extra,
        **forced,
    )
    assert chat.choices[0].message.content == expected
    chunks = client.chat.completions.create(
        model=model_name,
        messages=USER,  # type: ignore[arg-type]
        stream=True,
        extra_body=extra,
        **forced,
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected


@pytest.mark.parametrize(
    ("extra", "rule"),
    [
        ({"repetition_penalty": 1.5}, {"rep": 1.5}),
        ({"presence_penalty": 1.5}, {"pres": 1.5}),
        ({"frequency_penalty": 1.0}, {"freq": 1.0}),
        ({"frequency_penalty": -1.0}, {"freq": -1.0}),
    ],
)
def test_penalties_match_a_torch_reference(
    client: openai.OpenAI, model_name: str, model: Any, extra: dict[str, float], rule: dict[str, float]
) -> None:
    plain, _ = reference(model, PROMPT, 16)
    expected, _ = reference(model, PROMPT, 16, **rule)
    assert expected != plain, "this prompt no longer shows the penalty's effect: pick another"
    extra_body = {k: v for k, v in extra.items() if k == "repetition_penalty"}
    openai_args = {k: v for k, v in extra.items() if k != "repetition_penalty"}
    done = complete(client, model_name, max_tokens=16, extra_body=extra_body, **openai_args)
    assert token_ids(done.choices[0]) == expected


def test_min_tokens_holds_off_eos_and_stop_ids(client: openai.OpenAI, model_name: str) -> None:
    # EOS_PROMPT makes the tiny model emit EOS as its second token.
    early = client.completions.create(
        model=model_name,
        prompt=EOS_PROMPT,
        max_tokens=10,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    assert early.choices[0].finish_reason == "stop" and len(token_ids(early.choices[0])) == 2
    held = client.completions.create(
        model=model_name,
        prompt=EOS_PROMPT,
        max_tokens=10,
        temperature=0,
        extra_body={"return_token_ids": True, "min_tokens": 5},
    )
    assert len(token_ids(held.choices[0])) >= 5
    first = token_ids(complete(client, model_name).choices[0])[0]
    stopped = complete(client, model_name, extra_body={"stop_token_ids": [first]})
    assert token_ids(stopped.choices[0]) == [first] and stopped.choices[0].finish_reason == "stop"
    not_yet = complete(client, model_name, extra_body={"stop_token_ids": [first], "min_tokens": 3})
    assert len(token_ids(not_yet.choices[0])) >= 3 and first not in token_ids(not_yet.choices[0])[:3]


def test_min_p_one_keeps_only_the_top_token(client: openai.OpenAI, model_name: str) -> None:
    greedy = token_ids(complete(client, model_name).choices[0])
    hot = complete(client, model_name, temperature=2.0, seed=5, extra_body={"min_p": 1.0})
    assert token_ids(hot.choices[0]) == greedy


def test_n_choices_are_each_reproducible(client: openai.OpenAI, model_name: str) -> None:
    args: dict[str, Any] = {"temperature": 1.0, "seed": 11, "max_tokens": 8}
    first = complete(client, model_name, n=3, **args)
    again = complete(client, model_name, n=3, **args)
    assert [c.index for c in first.choices] == [0, 1, 2]
    outputs = [token_ids(c) for c in first.choices]
    assert outputs == [token_ids(c) for c in again.choices]
    assert len({tuple(o) for o in outputs}) > 1
    # Choice i is the request with seed + i on its own.
    for i, output in enumerate(outputs):
        alone = complete(client, model_name, **{**args, "seed": 11 + i})
        assert token_ids(alone.choices[0]) == output
    assert first.usage is not None
    assert first.usage.prompt_tokens == len(PROMPT) and first.usage.completion_tokens == 24

    stream = complete(client, model_name, n=3, stream=True, **args)
    streamed: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for chunk in stream:
        for choice in chunk.choices:
            streamed[choice.index].extend(token_ids(choice) if choice.model_extra.get("token_ids") else [])
    assert [streamed[i] for i in range(3)] == outputs


def test_echo_prepends_the_prompt(client: openai.OpenAI, model_name: str) -> None:
    done = client.completions.create(
        model=model_name, prompt="Return the", max_tokens=5, temperature=0, echo=True, logprobs=0
    )
    plain = client.completions.create(model=model_name, prompt="Return the", max_tokens=5, temperature=0)
    assert done.choices[0].text == "Return the" + plain.choices[0].text
    # The prompt's own entries come first (the first one null), then the generated tokens'.
    logprobs = done.choices[0].logprobs
    assert logprobs is not None and logprobs.text_offset is not None and logprobs.token_logprobs is not None
    assert logprobs.text_offset[0] == 0 and logprobs.token_logprobs[0] is None
    assert "".join(logprobs.tokens or []) == done.choices[0].text
    streamed = client.completions.create(
        model=model_name, prompt="Return the", max_tokens=5, temperature=0, echo=True, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == done.choices[0].text


def test_max_completion_tokens_wins_and_user_is_recorded(
    client: openai.OpenAI, model_name: str, stack: Stack
) -> None:
    done = client.chat.completions.create(
        model=model_name,
        messages=USER,  # type: ignore[arg-type]
        max_tokens=10,
        max_completion_tokens=3,
        temperature=0,
        user="user-1234",
        extra_body={"ignore_eos": True},
    )
    assert done.usage is not None and done.usage.completion_tokens == 3
    entries = redis.Redis.from_url(stack.redis_url).xrange(REQUESTS_STREAM)
    assert "user-1234" in {decode_request(fields[FIELD]).user for _, fields in entries}
