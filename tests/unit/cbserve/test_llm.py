"""`LLM`, the engine in this process: greedy output equal to transformers' `generate` for each prompt
alone while they run batched (chunked prefill included), chat as generate on the template transformers
renders, vLLM's output shape, stop rules, and refusals."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.gpu.gpu_parity import reference_greedy
from cbserve import LLM, SamplingParams
from cbserve.offline.outputs import Logprob, RequestOutput
from harness.processes.fresh_python import heavy_imports
from tests.unit.cbserve.cpu_llm import cpu_llm

BUDGET = 32  # tokens per step: the 70-token prompt is prefilled in three chunks
PROMPT_LENS = [3, 9, 21, 70, 5]
MAX_TOKENS = [12, 7, 16, 10, 20]
# The tiny model's greedy continuation of this prompt is [461, 0, ...]: EOS (0) second.
EOS_PROMPT = [462, 383, 46, 427, 255, 274, 170, 352]
QUESTION = [{"role": "user", "content": "What does the import statement do?"}]


SIZES = {"num_blocks": 64, "block_size": 8, "max_num_seqs": 8, "max_num_batched_tokens": BUDGET}


@pytest.fixture(scope="module", params=[False, True], ids=["one-step", "async-scheduling"])
def llm(tiny_model_dir: Path, request: pytest.FixtureRequest) -> Iterator[LLM]:
    # Async scheduling launches the next step before reading the last: nothing a caller sees changes.
    yield cpu_llm(tiny_model_dir, async_scheduling=request.param, **SIZES)


def greedy(max_tokens: int, **extra: object) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **extra)  # type: ignore[arg-type]


def prompts(vocab_size: int) -> list[list[int]]:
    rng = random.Random(7)
    return [[rng.randrange(3, vocab_size) for _ in range(n)] for n in PROMPT_LENS]


def only(output: RequestOutput) -> list[int]:
    assert len(output.outputs) == 1
    return output.outputs[0].token_ids


def test_importing_cbserve_loads_no_torch() -> None:
    assert "torch" not in heavy_imports("import cbserve; assert 'LLM' in cbserve.__all__", timeout=60)


def test_batched_greedy_equals_generate_of_each_prompt_alone(llm: LLM, tiny_model_dir: Path) -> None:
    cases = prompts(llm.get_tokenizer().vocab_size)
    expected = reference_greedy(tiny_model_dir, cases, MAX_TOKENS)
    partial_before = llm.llm_engine.stats.num_partial_prefills
    params = [greedy(m) for m in MAX_TOKENS]  # one per prompt
    outputs = llm.generate([{"prompt_token_ids": p} for p in cases], params, use_tqdm=False)
    assert [o.prompt_token_ids for o in outputs] == cases  # the prompts' order
    assert [only(o) for o in outputs] == expected
    assert llm.llm_engine.stats.num_partial_prefills > partial_before  # the 70-token prompt was chunked
    assert not llm.llm_engine.has_unfinished_requests()


def test_output_has_vllms_shape(llm: LLM) -> None:
    text = "The import statement"
    out = llm.generate(text, greedy(6), use_tqdm=False)
    assert len(out) == 1
    first = out[0]
    assert isinstance(first.request_id, str) and first.finished and first.prompt == text
    assert first.prompt_token_ids == llm.get_tokenizer().encode(text, add_special_tokens=True)
    assert first.prompt_logprobs is None and first.num_cached_tokens == 0
    completion = first.outputs[0]
    assert completion.index == 0 and len(completion.token_ids) == 6 and completion.finished()
    assert completion.text == llm.get_tokenizer().decode(completion.token_ids)
    assert (completion.finish_reason, completion.stop_reason) == ("length", None)
    assert completion.logprobs is None and completion.cumulative_logprob is None
    # Token ids as a plain list and as vLLM's dict give the same request.
    by_ids = llm.generate(first.prompt_token_ids, greedy(6), use_tqdm=False)[0]
    assert by_ids.prompt is None and only(by_ids) == completion.token_ids
    assert llm.generate({"prompt": text}, greedy(6), use_tqdm=False)[0].outputs[0].text == completion.text


def test_each_prompt_gets_its_own_sampling_params_in_order(llm: LLM) -> None:
    texts = ["a", "The for loop", "import os", "class"]
    lengths = [5, 1, 9, 3]
    outputs = llm.generate(texts, [greedy(n) for n in lengths], use_tqdm=False)
    assert [o.prompt for o in outputs] == texts
    assert [len(only(o)) for o in outputs] == lengths
    assert len({o.request_id for o in outputs}) == len(texts)
    with pytest.raises(ValueError, match="2 sampling_params for 4 prompts"):
        llm.generate(texts, [greedy(1), greedy(2)])


def test_chat_is_generate_on_the_template_transformers_renders(llm: LLM, tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    rendered = AutoTokenizer.from_pretrained(tiny_model_dir).apply_chat_template(
        QUESTION, add_generation_prompt=True, tokenize=True
    )["input_ids"]
    chat = llm.chat(QUESTION, greedy(8), use_tqdm=False)[0]
    assert chat.prompt_token_ids == rendered
    assert chat.prompt is not None and chat.prompt.endswith("assistant\n")
    plain = llm.generate({"prompt_token_ids": rendered}, greedy(8), use_tqdm=False)[0]
    assert chat.outputs[0].token_ids == plain.outputs[0].token_ids
    assert chat.outputs[0].text == plain.outputs[0].text
    # A list of conversations: one output each, in order.
    other = [{"role": "user", "content": "And the for loop?"}]
    both = llm.chat([QUESTION, other], greedy(8), use_tqdm=False)
    assert both[0].outputs[0].token_ids == chat.outputs[0].token_ids
    assert both[1].prompt_token_ids != rendered


def test_eos_and_stop_token_ids_end_the_output_unseen(llm: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=8)
    eos = llm.generate({"prompt_token_ids": EOS_PROMPT}, params, use_tqdm=False)[0].outputs[0]
    assert eos.token_ids == [461, 0] and (eos.finish_reason, eos.stop_reason) == ("stop", None)
    assert eos.text == llm.get_tokenizer().decode([461])
    free = only(llm.generate("The for loop", greedy(10), use_tqdm=False)[0])
    stop_id = next(t for i, t in enumerate(free) if i >= 2 and t not in free[:i])
    out = llm.generate("The for loop", greedy(10, stop_token_ids=[stop_id]), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == free[: free.index(stop_id) + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop_id)


def test_a_stop_string_cuts_the_text_and_ends_the_request(llm: LLM) -> None:
    free = llm.generate("The import statement", greedy(16), use_tqdm=False)[0].outputs[0]
    stop = next(free.text[i : i + 2] for i in range(3, len(free.text)) if free.text[i : i + 2].isprintable())
    cut = free.text.index(stop)
    out = llm.generate("The import statement", greedy(16, stop=[stop]), use_tqdm=False)[0].outputs[0]
    assert out.text == free.text[:cut]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert len(out.token_ids) < len(free.token_ids) and out.token_ids == free.token_ids[: len(out.token_ids)]
    kept = llm.generate(
        "The import statement", greedy(16, stop=stop, include_stop_str_in_output=True), use_tqdm=False
    )
    assert kept[0].outputs[0].text == free.text[: cut + len(stop)]
    assert not llm.llm_engine.has_unfinished_requests()


def test_logprobs_in_vllms_shape(llm: LLM) -> None:
    out = llm.generate("The import", greedy(4, logprobs=2, prompt_logprobs=1), use_tqdm=False)[0]
    completion = out.outputs[0]
    assert completion.logprobs is not None and len(completion.logprobs) == 4
    for token_id, entry in zip(completion.token_ids, completion.logprobs, strict=True):
        assert next(iter(entry)) == token_id  # the sampled token first
        assert entry[token_id].rank == 1  # greedy: the most likely
        assert isinstance(entry[token_id], Logprob) and entry[token_id].decoded_token is not None
        assert 1 <= len(entry) <= 3
    total = sum(entry[t].logprob for t, entry in zip(completion.token_ids, completion.logprobs, strict=True))
    assert completion.cumulative_logprob == pytest.approx(total)
    assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == len(out.prompt_token_ids)
    assert out.prompt_logprobs[0] is None
    positions = zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:], strict=True)
    assert all(entry is not None and next(iter(entry)) == t for t, entry in positions)


def test_a_prompt_that_leaves_no_room_is_refused(llm: LLM) -> None:
    too_long = [5] * llm.llm_engine.max_model_len
    with pytest.raises(ValueError, match="leaves no room"):
        llm.generate([[5, 6], too_long], greedy(1))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[5, 10**6]], greedy(1))
    assert not llm.llm_engine.has_unfinished_requests()


def test_the_engine_steps_prompt_chunks_then_decodes(tiny_model_dir: Path) -> None:
    """`LLMEngine` stepped by hand, one step at a time as the benchmarks step it: prompt chunks
    while `has_prompts_to_compute()`, then decode-only steps of one token per request."""
    engine = cpu_llm(tiny_model_dir, **SIZES).llm_engine
    engine.add_request("chunked", list(range(3, 3 + 70)), greedy(4))  # three chunks under BUDGET
    engine.add_request("short", [5, 6, 7], greedy(4))
    prefill_steps = 0
    while engine.has_prompts_to_compute():
        assert engine.step().ran
        prefill_steps += 1
    assert prefill_steps >= 3
    decode = engine.step()
    assert sorted(event.req_id for event in decode.events) == ["chunked", "short"]
    while engine.has_unfinished_requests():
        engine.step()
    assert not engine.has_prompts_to_compute()


def test_what_cannot_be_honoured_is_refused_by_name(tiny_model_dir: Path) -> None:
    model = str(tiny_model_dir)
    with pytest.raises(ValueError, match=r"tensor_parallel_size=2\) is not supported"):
        LLM(model, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="dtype='float64'"):
        LLM(model, dtype="float64", device="cpu")
    with pytest.raises(TypeError, match="unexpected keyword argument 'swap_spaces'"):
        LLM(model, swap_spaces=4)
    with pytest.raises(TypeError, match="'n'"):
        SamplingParams(n=2)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="must not be empty"):
        SamplingParams(stop=[""])
