"""The worker's image pieces alone: the encoder cache's bound and order, M-RoPE positions equal to
transformers' `get_rope_index`, placeholder runs checked against the prompt, and vision-language
checkpoints of other architectures refused by name."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import LlavaConfig, PretrainedConfig, Qwen2_5_VLConfig

from common.protocol import MultiModalFeature, PlaceholderRange, TensorData
from gpu_worker.runner.model_support import UnsupportedModelError, check_model_supported
from gpu_worker.runner.multimodal.encoder_cache import EncoderCache
from gpu_worker.runner.multimodal.mm_inputs import image_inputs
from gpu_worker.runner.multimodal.mrope import mrope_positions, step_mrope_positions


def test_the_encoder_cache_keeps_the_most_recent_images_within_its_bound() -> None:
    cache = EncoderCache(max_num_tokens=10)
    cache.put("a", torch.zeros(4, 2))
    cache.put("b", torch.zeros(4, 2))
    assert cache.get("a") is not None  # a is now the most recent
    cache.put("c", torch.zeros(4, 2))  # 12 tokens: b goes
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None
    cache.put("huge", torch.zeros(11, 2))  # used by its step, never kept
    assert cache.get("huge") is None and len(cache) == 2
    assert (cache.num_encoder_runs, cache.num_cache_hits, cache.num_tokens) == (4, 3, 8)


def tensor_data(tensor: torch.Tensor) -> TensorData:
    return TensorData(
        dtype=str(tensor.dtype).removeprefix("torch."),
        shape=list(tensor.shape),
        data=tensor.numpy().tobytes(),
    )


def feature(offset: int, length: int, grid: tuple[int, int, int] = (1, 4, 4)) -> MultiModalFeature:
    data = {
        "pixel_values": tensor_data(torch.zeros(grid[0] * grid[1] * grid[2], 8)),
        "image_grid_thw": tensor_data(torch.tensor([grid])),
    }
    return MultiModalFeature(
        identifier=f"img{offset}", mm_position=PlaceholderRange(offset=offset, length=length), data=data
    )


def test_mrope_positions_equal_get_rope_index() -> None:
    from transformers import Qwen2_5_VLModel

    config = Qwen2_5_VLConfig(
        text_config={
            "hidden_size": 16,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "num_hidden_layers": 1,
        },
        vision_config={"depth": 1, "hidden_size": 16, "num_heads": 2, "out_hidden_size": 16},
        image_token_id=7,
    )
    # Two images (grids 4x4 and 6x4 patches, merged 2x2: 4 and 6 tokens) among text.
    features = [feature(3, 4, (1, 4, 4)), feature(10, 6, (1, 6, 4))]
    num_prompt = 20
    ids = torch.tensor([[1, 2, 3, *[7] * 4, 4, 5, 6, *[7] * 6, 8, 9, 10, 11]])
    types = (ids == 7).int()
    model = Qwen2_5_VLModel.__new__(Qwen2_5_VLModel)  # get_rope_index reads the config alone
    model.config = config
    grids = torch.tensor([[1, 4, 4], [1, 6, 4]])
    rope_index: Any = model.get_rope_index  # typed for LongTensor / IntTensor, which plain tensors are
    expected, delta = rope_index(ids, mm_token_type_ids=types, image_grid_thw=grids)
    positions, our_delta = mrope_positions(num_prompt, image_inputs(features, num_prompt), 2)
    assert torch.equal(positions, expected[:, 0].t())
    assert our_delta == int(delta)
    # Output tokens: their index plus the delta, in every row.
    step = step_mrope_positions(torch.tensor([18, 19, 20, 21]), positions, num_prompt, our_delta)
    assert step[:2].tolist() == positions[18:].tolist()
    assert step[2:].tolist() == [[20 + our_delta] * 3, [21 + our_delta] * 3]


def test_placeholder_runs_must_lie_apart_inside_the_prompt() -> None:
    with pytest.raises(ValueError, match="inside the prompt"):
        image_inputs([feature(18, 4)], 20)
    with pytest.raises(ValueError, match="run of their own"):
        image_inputs([feature(2, 4), feature(5, 4)], 20)


def test_other_vision_language_architectures_are_refused_by_name() -> None:
    config: PretrainedConfig = LlavaConfig()
    config.architectures = ["LlavaNextForConditionalGeneration"]
    with pytest.raises(UnsupportedModelError, match="LlavaNextForConditionalGeneration is not served"):
        check_model_supported(config)
    served = LlavaConfig()
    served.architectures = ["LlavaForConditionalGeneration"]
    check_model_supported(served)
