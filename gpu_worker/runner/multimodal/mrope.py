"""Qwen2.5-VL's M-RoPE positions (vLLM's MRotaryEmbedding.get_input_positions, transformers'
`get_rope_index` for images): three rows per prompt token (temporal, height, width). A text token has
its index since the last image in all three, continuing from there; an image's tokens are its
merged patch grid, offset by the position it starts at; the text after it starts at that position
plus the grid's larger side. Tokens past the prompt (outputs) sit at their index plus the request's
`delta` (the last prompt position + 1 - the prompt length) in every row.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gpu_worker.runner.multimodal.mm_inputs import ImageInput


def mrope_positions(
    num_prompt_tokens: int, images: Sequence[ImageInput], spatial_merge_size: int
) -> tuple[torch.Tensor, int]:
    """The prompt's positions [P, 3] and the request's delta for tokens after it."""
    parts: list[torch.Tensor] = []
    cursor = 0  # prompt index where the text before the next image starts
    current = 0  # the position the next token gets
    for image in sorted(images, key=lambda i: i.offset):
        text_len = image.offset - cursor
        parts.append(torch.arange(current, current + text_len).unsqueeze(0).expand(3, -1))
        current += text_len
        grid_t, grid_h, grid_w = (int(x) for x in image.data["image_grid_thw"].reshape(-1, 3)[0])
        llm_t, llm_h, llm_w = grid_t, grid_h // spatial_merge_size, grid_w // spatial_merge_size
        if llm_t * llm_h * llm_w != image.length:
            raise ValueError(
                f"image {image.identifier[:12]}: grid {grid_t}x{grid_h}x{grid_w} gives "
                f"{llm_t * llm_h * llm_w} tokens, its placeholder run has {image.length}"
            )
        t, h, w = torch.meshgrid(
            torch.arange(llm_t) + current,
            torch.arange(llm_h) + current,
            torch.arange(llm_w) + current,
            indexing="ij",
        )
        parts.append(torch.stack([t, h, w]).reshape(3, -1))
        current += max(grid_h, grid_w) // spatial_merge_size
        cursor = image.offset + image.length
    parts.append(torch.arange(current, current + num_prompt_tokens - cursor).unsqueeze(0).expand(3, -1))
    positions = torch.cat(parts, dim=1)
    delta = int(positions.max()) + 1 - num_prompt_tokens if num_prompt_tokens else 0
    return positions.t().contiguous(), delta


def step_mrope_positions(
    positions: torch.Tensor, prompt_positions: torch.Tensor | None, num_prompt_tokens: int, delta: int
) -> torch.Tensor:
    """The [T, 3] positions of one request's step tokens at indexes `positions` [T]."""
    out = (positions + delta).unsqueeze(-1).expand(-1, 3).clone()
    if prompt_positions is not None:
        in_prompt = positions < num_prompt_tokens
        out[in_prompt] = prompt_positions[positions[in_prompt]]
    return out
