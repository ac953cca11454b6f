"""Request lists: random, capped-exponential, ShareGPT, prefix-repetition, multi-turn and repetitive
prompts, each a seeded, reproducible list.

Every generator returns token-id prompts with the output length each request asks for (`max_tokens`,
sent with `ignore_eos` so the server produces exactly that many tokens). The same arguments and seed
always give the same list, which is what lets compare mode run several systems on identical load.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.workloads.repetitive import repetitive_prompt
from benchmarks.workloads.tokenizer import BenchTokenizer

# ShareGPT filters, as in vLLM's benchmark: drop conversations too short to time or too long to fit.
SHAREGPT_MIN_TOKENS = 4
SHAREGPT_MAX_PROMPT_TOKENS = 1024


@dataclass(frozen=True, slots=True)
class SampleRequest:
    prompt_token_ids: list[int]  # the prompt as ids (sent as-is, or detokenized for text servers)
    output_len: int  # max_tokens of this request

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


@dataclass(frozen=True, slots=True)
class DatasetConfig:
    name: str  # one of DATASETS
    num_prompts: int
    seed: int
    input_len: int = 1024  # random / capped-exponential: centre of the input-length range
    output_len: int = 128  # random: centre of the output-length range
    range_ratio: float = 0.0  # lengths uniform in [L * (1 - r), L * (1 + r)]
    output_mean: float = 128.0  # capped-exponential: mean of the exponential output lengths
    output_cap: int = 1024  # capped-exponential and sharegpt: longest output asked for
    sharegpt_path: str | None = None  # ShareGPT-format JSON file
    max_model_len: int = 2048  # sharegpt: prompt + output must fit; long prompts: their output is cut to fit
    long_prompt_len: int = 0  # > 0: some requests get a prompt this long instead (a prefill spike)
    long_prompt_fraction: float = 0.0  # share of requests that get one (at least one when > 0)
    # prefix-repetition (vLLM bench's): `num_prefixes` shared prefixes, each request one of them
    # followed by its own random suffix.
    prefix_len: int = 256
    suffix_len: int = 256
    num_prefixes: int = 10
    prefix_output_len: int = 128
    # multi-turn: conversations of `turns` requests; the first prompt has `input_len` tokens, and each
    # later one resends the history (earlier prompts and `output_len`-token replies) plus a new
    # `turn_len`-token message.
    turns: int = 4
    turn_len: int = 64


def length_range(centre: int, range_ratio: float) -> tuple[int, int]:
    """[floor(L(1-r)), ceil(L(1+r))], at least 1: vLLM's random-dataset length range."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    low = max(1, math.floor(centre * (1.0 - range_ratio)))
    high = max(low, math.ceil(centre * (1.0 + range_ratio)))
    return low, high


def _rng(seed: int, stream: int) -> np.random.Generator:
    # Separate streams for lengths, token ids and arrivals: changing one never shifts the others.
    return np.random.default_rng([seed, stream])


def _random_prompts(
    input_lens: np.ndarray, vocab_ids: list[int], rng: np.random.Generator
) -> list[list[int]]:
    ids = np.asarray(vocab_ids, dtype=np.int64)
    return [[int(t) for t in rng.choice(ids, size=int(n))] for n in input_lens]


def random_requests(config: DatasetConfig, vocab_ids: list[int]) -> list[SampleRequest]:
    """Input and output lengths uniform in their ranges; prompt ids uniform over the vocabulary."""
    lengths = _rng(config.seed, 0)
    in_low, in_high = length_range(config.input_len, config.range_ratio)
    out_low, out_high = length_range(config.output_len, config.range_ratio)
    input_lens = lengths.integers(in_low, in_high + 1, size=config.num_prompts)
    output_lens = lengths.integers(out_low, out_high + 1, size=config.num_prompts)
    prompts = _random_prompts(input_lens, vocab_ids, _rng(config.seed, 1))
    return [SampleRequest(p, int(o)) for p, o in zip(prompts, output_lens, strict=True)]


def capped_exponential_requests(config: DatasetConfig, vocab_ids: list[int]) -> list[SampleRequest]:
    """Anyscale's continuous-batching load: outputs exponential around a mean, capped; inputs uniform."""
    if config.output_mean <= 0 or config.output_cap < 1:
        raise ValueError("--output-mean must be > 0 and --output-cap >= 1")
    lengths = _rng(config.seed, 0)
    in_low, in_high = length_range(config.input_len, config.range_ratio)
    input_lens = lengths.integers(in_low, in_high + 1, size=config.num_prompts)
    raw = lengths.exponential(config.output_mean, size=config.num_prompts)
    output_lens = np.clip(np.rint(raw), 1, config.output_cap).astype(np.int64)
    prompts = _random_prompts(input_lens, vocab_ids, _rng(config.seed, 1))
    return [SampleRequest(p, int(o)) for p, o in zip(prompts, output_lens, strict=True)]


def _sharegpt_pairs(path: Path) -> list[tuple[str, str]]:
    """(first human turn, first reply) of every conversation with at least two turns."""
    data = json.loads(path.read_text(encoding="utf-8"))
    pairs: list[tuple[str, str]] = []
    for entry in data:
        turns = entry.get("conversations") or entry.get("conversation") or []
        if len(turns) >= 2:
            pairs.append((str(turns[0].get("value", "")), str(turns[1].get("value", ""))))
    return pairs


def sharegpt_requests(config: DatasetConfig, tokenizer: BenchTokenizer) -> list[SampleRequest]:
    """Conversations in a seeded order; the output length is the reference reply's, capped."""
    if config.sharegpt_path is None:
        raise ValueError("--dataset sharegpt needs --dataset-path FILE (ShareGPT-format JSON)")
    pairs = _sharegpt_pairs(Path(config.sharegpt_path))
    order = _rng(config.seed, 0).permutation(len(pairs))
    requests: list[SampleRequest] = []
    for index in order:
        prompt, reply = pairs[int(index)]
        prompt_ids = tokenizer.encode(prompt)
        output_len = min(len(tokenizer.encode(reply)), config.output_cap)
        too_short = len(prompt_ids) < SHAREGPT_MIN_TOKENS or output_len < SHAREGPT_MIN_TOKENS
        too_long = (
            len(prompt_ids) > SHAREGPT_MAX_PROMPT_TOKENS
            or len(prompt_ids) + output_len > config.max_model_len
        )
        if too_short or too_long:
            continue
        requests.append(SampleRequest(prompt_ids, output_len))
        if len(requests) == config.num_prompts:
            return requests
    raise ValueError(
        f"{config.sharegpt_path} has only {len(requests)} usable conversations; "
        f"lower --num-prompts (asked for {config.num_prompts})"
    )


def mix_in_long_prompts(
    requests: list[SampleRequest], config: DatasetConfig, vocab_ids: list[int]
) -> list[SampleRequest]:
    """Give a seeded subset of requests a `long_prompt_len`-token prompt: the load that shows whether
    a long prefill stalls the decodes running beside it (chunked prefill vs TGI-style admission)."""
    if config.long_prompt_len <= 0 or config.long_prompt_fraction <= 0:
        return requests
    if not 0.0 < config.long_prompt_fraction <= 1.0:
        raise ValueError("--long-prompt-fraction must be in (0, 1]")
    room = config.max_model_len - config.long_prompt_len
    if room < 1:
        raise ValueError("--long-prompt-len must be below --max-model-len (the output needs room)")
    count = max(1, round(config.long_prompt_fraction * len(requests)))
    chosen = _rng(config.seed, 3).choice(len(requests), size=count, replace=False)
    prompts = _random_prompts(np.full(count, config.long_prompt_len), vocab_ids, _rng(config.seed, 4))
    mixed = list(requests)
    for index, prompt in zip(chosen, prompts, strict=True):
        mixed[int(index)] = SampleRequest(prompt, min(mixed[int(index)].output_len, room))
    return mixed


def prefix_repetition_requests(config: DatasetConfig, vocab_ids: list[int]) -> list[SampleRequest]:
    """vLLM bench's prefix_repetition: requests spread evenly over the prefixes, in seeded order."""
    if config.num_prefixes < 1 or config.prefix_len < 0 or config.suffix_len < 1:
        raise ValueError("prefix-repetition needs num_prefixes >= 1, prefix_len >= 0, suffix_len >= 1")
    prefixes = _random_prompts(
        np.full(config.num_prefixes, config.prefix_len), vocab_ids, _rng(config.seed, 1)
    )
    suffixes = _random_prompts(
        np.full(config.num_prompts, config.suffix_len), vocab_ids, _rng(config.seed, 2)
    )
    order = _rng(config.seed, 0).permutation(config.num_prompts)
    return [
        SampleRequest(prefixes[int(i) % config.num_prefixes] + suffixes[int(i)], config.prefix_output_len)
        for i in order
    ]


def multi_turn_requests(config: DatasetConfig, vocab_ids: list[int]) -> list[SampleRequest]:
    """Conversations whose every turn resends the history; all first turns, then all second turns...
    The replies in the history are drawn tokens standing in for the model's (the list is fixed
    before any server runs), so only earlier prompts can be found in a server's cache."""
    if config.turns < 1 or config.turn_len < 1:
        raise ValueError("multi-turn needs turns >= 1 and turn_len >= 1")
    num_conversations = -(-config.num_prompts // config.turns)
    rng = _rng(config.seed, 1)
    histories = _random_prompts(np.full(num_conversations, config.input_len), vocab_ids, rng)
    requests: list[SampleRequest] = []
    for turn in range(config.turns):
        for c in range(num_conversations):
            if turn:
                more = _random_prompts(np.array([config.output_len, config.turn_len]), vocab_ids, rng)
                histories[c] = histories[c] + more[0] + more[1]
            requests.append(SampleRequest(list(histories[c]), config.output_len))
    return requests[: config.num_prompts]


def repetitive_requests(config: DatasetConfig, tokenizer: BenchTokenizer) -> list[SampleRequest]:
    """Text whose answer repeats its prompt (benchmarks/workloads/repetitive.py), in turn a code edit, a
    summary that quotes and an agent turn echoing a tool result; prompts of up to `input_len` tokens
    (whole pieces of them), `output_len` tokens asked for."""
    rng = _rng(config.seed, 5)
    return [
        SampleRequest(repetitive_prompt(i % 3, config.input_len, tokenizer.encode, rng), config.output_len)
        for i in range(config.num_prompts)
    ]


def ideal_cached_tokens(requests: list[SampleRequest], block_size: int) -> int:
    """Prompt tokens an unbounded cache of whole blocks would serve, each request seeing every
    earlier prompt (at least one token of each is always computed)."""
    seen: set[tuple[int, ...]] = set()
    total = 0
    for req in requests:
        ids = req.prompt_token_ids
        num_full = len(ids) // block_size
        prefixes = [tuple(ids[: (i + 1) * block_size]) for i in range(num_full)]
        hits = 0
        for i, prefix in enumerate(prefixes[: (len(ids) - 1) // block_size]):
            if prefix not in seen:
                break
            hits = i + 1
        total += hits * block_size
        seen.update(prefixes)
    return total


# Each dataset's generator: over random ids of the vocabulary, or over text the tokenizer encodes.
_OVER_IDS: dict[str, Callable[[DatasetConfig, list[int]], list[SampleRequest]]] = {
    "random": random_requests,
    "capped-exponential": capped_exponential_requests,
    "prefix-repetition": prefix_repetition_requests,
    "multi-turn": multi_turn_requests,
}
_OVER_TEXT: dict[str, Callable[[DatasetConfig, BenchTokenizer], list[SampleRequest]]] = {
    "sharegpt": sharegpt_requests,
    "repetitive": repetitive_requests,
}
DATASETS = (*_OVER_IDS, *_OVER_TEXT)


def sample_requests(config: DatasetConfig, tokenizer: BenchTokenizer) -> list[SampleRequest]:
    if config.num_prompts < 1:
        raise ValueError("--num-prompts must be at least 1")
    if config.name in _OVER_IDS:
        requests = _OVER_IDS[config.name](config, tokenizer.sampleable_ids())
    elif config.name in _OVER_TEXT:
        requests = _OVER_TEXT[config.name](config, tokenizer)
    else:
        raise ValueError(f"unknown dataset {config.name!r}; choose one of {', '.join(DATASETS)}")
    return mix_in_long_prompts(requests, config, tokenizer.sampleable_ids())
