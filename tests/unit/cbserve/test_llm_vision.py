"""`LLM` with images (vLLM's prompt dicts with "multi_modal_data"): for tiny random LLaVA, Qwen2.5-VL
and Gemma 3 models, requests with one and two images batched with text-only ones give greedy tokens
equal to transformers' `generate` on the processor's output for each request alone (fp32); a step
computes 8 tokens, so LLaVA's and Qwen2.5-VL's image runs are split across prefill chunks, and Gemma
3's (4 tokens, attended bidirectionally) are computed whole; an image sent again is not encoded
again; the same text with another image is not a prefix-cache hit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cbserve import LLM, SamplingParams
from cbserve.offline.mm_prompts import multimodal_prompt
from harness.models.vision_reference import ReferenceModel, build_model, chat_text, image
from tests.unit.cbserve.cpu_llm import cpu_llm

FAMILIES = ("llava", "qwen2_5_vl", "gemma3")
BUDGET = 8  # tokens per step: each image's placeholder run (4 to 16 tokens) spans chunks
MAX_TOKENS = 10


@pytest.fixture(scope="module", params=FAMILIES)
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    family: str = request.param
    return build_model(tmp_path_factory.mktemp(family) / family, family)


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> ReferenceModel:
    return ReferenceModel(model_dir)


@pytest.fixture(scope="module")
def llm(model_dir: Path) -> Iterator[LLM]:
    yield cpu_llm(
        model_dir,
        enforce_eager=True,
        num_blocks=128,
        block_size=8,
        max_num_seqs=8,
        max_num_batched_tokens=BUDGET,
    )


def greedy() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def case(reference: ReferenceModel, question: str, images: list[Any]) -> dict[str, Any]:
    """vLLM's prompt dict of a chat turn; without images, the processor's token ids (so that both
    sides tokenize the template's text alike)."""
    text = chat_text(reference.processor, question, len(images))
    if images:
        return {"prompt": text, "multi_modal_data": {"image": images}}
    return {"prompt_token_ids": reference.processor(text=[text])["input_ids"][0], "text": text}


def encoder_runs(llm: LLM) -> int:
    """What the worker reported encoding, as the batcher counts it for /metrics."""
    engine = llm.llm_engine
    return engine.scheduler.workers[engine.worker_id].num_encoder_runs


def test_images_batched_with_text_equal_generate_alone(llm: LLM, reference: ReferenceModel) -> None:
    cases = [
        case(reference, "What is in the picture?", [image(1)]),
        case(reference, "What does the import statement do?", []),
        case(reference, "Compare them.", [image(2, (64, 48)), image(3)]),
        case(reference, "Describe it", [image(4, (48, 64))]),
    ]
    texts = [c.pop("text", None) or c["prompt"] for c in cases]
    worker = llm.llm_engine.scheduler.workers[llm.llm_engine.worker_id]
    hits = worker.num_encoder_cache_hits
    outputs = llm.generate(cases, greedy(), use_tqdm=False)
    for c, text, out in zip(cases, texts, outputs, strict=True):
        images = c.get("multi_modal_data", {}).get("image", [])
        assert out.outputs[0].token_ids == reference.greedy(text, images, MAX_TOKENS), text
    # A chunk that split an image took its rows from the cached output; Gemma 3's runs are whole.
    split = reference.model.config.model_type != "gemma3"
    assert (worker.num_encoder_cache_hits > hits) == split


def test_token_ids_with_images_expand_as_text_does(llm: LLM, reference: ReferenceModel) -> None:
    """vLLM's {"prompt_token_ids": ..., "multi_modal_data": ...}: each image's one placeholder in
    the ids is expanded by the processor, as in a text prompt."""
    text = chat_text(reference.processor, "What is in the picture?", 1)
    ids = reference.processor.tokenizer(text)["input_ids"]
    out = llm.generate(
        {"prompt_token_ids": ids, "multi_modal_data": {"image": image(1)}}, greedy(), use_tqdm=False
    )
    assert out[0].prompt_token_ids == reference.processor(text=[text], images=[[image(1)]])["input_ids"][0]
    assert out[0].outputs[0].token_ids == reference.greedy(text, [image(1)], MAX_TOKENS)


def test_an_image_sent_again_is_not_encoded_again(llm: LLM, reference: ReferenceModel) -> None:
    before = encoder_runs(llm)
    first = llm.generate(case(reference, "Look.", [image(11)]), greedy(), use_tqdm=False)[0]
    assert encoder_runs(llm) == before + 1  # encoded once, though its run spans several chunks
    again = llm.generate(case(reference, "Look again.", [image(11)]), greedy(), use_tqdm=False)[0]
    assert encoder_runs(llm) == before + 1
    assert first.outputs[0].token_ids == reference.greedy(first.prompt or "", [image(11)], MAX_TOKENS)
    assert again.outputs[0].token_ids == reference.greedy(again.prompt or "", [image(11)], MAX_TOKENS)


def test_another_image_is_not_a_prefix_cache_hit(llm: LLM, reference: ReferenceModel) -> None:
    question = "Tell me about this picture, and about the way it was made, in a few words."
    c = case(reference, question, [image(21)])
    llm.generate(c, greedy(), use_tqdm=False)
    same = llm.generate(c, greedy(), use_tqdm=False)[0]
    other = llm.generate(case(reference, question, [image(22)]), greedy(), use_tqdm=False)[0]
    image_start = same.prompt_token_ids.index(reference.vision.image_token_id)
    assert same.num_cached_tokens > image_start  # the blocks past the image are found
    assert other.num_cached_tokens <= image_start  # the blocks from its image on are not
    assert other.outputs[0].token_ids == reference.greedy(c["prompt"], [image(22)], MAX_TOKENS)


def test_images_are_refused_by_name_without_a_vision_model() -> None:
    with pytest.raises(ValueError, match="takes no images"):
        multimodal_prompt("hi <image>", {"image": [image(1)]}, None, str)
    with pytest.raises(ValueError, match='holds "image"'):
        multimodal_prompt("hi", {"audio": []}, None, str)


def test_the_compiled_decoder_takes_embeddings_and_mrope(
    model_dir: Path, reference: ReferenceModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WORKER_COMPILE's forward (compiled ahead, as a file) of the decoder families, taking a step's
    embeddings and, for Qwen2.5-VL, three position rows per token: `generate`'s tokens still (Gemma 3
    runs transformers' forward, which is not compiled)."""
    monkeypatch.setenv("WORKER_COMPILE", "true")
    monkeypatch.setenv("WORKER_COMPILE_CACHE_DIR", str(tmp_path / "compiled"))
    compiled = cpu_llm(model_dir, num_blocks=64, block_size=8, max_num_seqs=4, max_num_batched_tokens=BUDGET)
    decoder = compiled.llm_engine.runner.model.decoder  # type: ignore[attr-defined]  # a ModelRunner
    assert (decoder is None) == (model_dir.name == "gemma3")
    assert decoder is None or decoder.run is not decoder.logits_of
    c = case(reference, "Compare them.", [image(2, (64, 48)), image(3)])
    out = compiled.generate(c, greedy(), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == reference.greedy(
        c["prompt"], c["multi_modal_data"]["image"], MAX_TOKENS
    )
