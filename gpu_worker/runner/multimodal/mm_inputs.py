"""A request's images as the worker holds them: `MultiModalFeature`s off the wire, their tensors
decoded once when the request arrives, and checked against its prompt."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from common.protocol import MultiModalFeature, TensorData


@dataclass(slots=True, frozen=True)
class ImageInput:
    identifier: str  # content hash: the encoder cache's key
    offset: int  # prompt index of its first placeholder token
    length: int  # placeholder tokens, one embedding each
    data: dict[str, torch.Tensor]  # the processor's outputs for it, on the host

    @property
    def end(self) -> int:
        return self.offset + self.length


def tensor_of(data: TensorData) -> torch.Tensor:
    """A wire tensor as a host tensor (a copy: the message's bytes are read-only)."""
    dtype = getattr(torch, data.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"tensor of unknown dtype {data.dtype!r}")
    if not data.data:
        return torch.empty(data.shape, dtype=dtype)
    return torch.frombuffer(bytearray(data.data), dtype=dtype).reshape(data.shape)


def image_inputs(features: Sequence[MultiModalFeature], num_prompt_tokens: int) -> list[ImageInput]:
    """The request's images in prompt order; ValueError (the request fails alone) when a placeholder
    run leaves the prompt or overlaps another, or a tensor's bytes do not fit its shape."""
    images = sorted(
        (
            ImageInput(
                identifier=f.identifier,
                offset=f.mm_position.offset,
                length=f.mm_position.length,
                data={name: tensor_of(t) for name, t in f.data.items()},
            )
            for f in features
        ),
        key=lambda i: i.offset,
    )
    previous_end = 0
    for image in images:
        if image.length < 1 or image.offset < previous_end or image.end > num_prompt_tokens:
            raise ValueError(
                f"image {image.identifier[:12]}: placeholder tokens [{image.offset}, {image.end}) are not "
                f"a run of their own inside the prompt of {num_prompt_tokens} tokens"
            )
        if "pixel_values" not in image.data:
            raise ValueError(f"image {image.identifier[:12]}: no pixel_values")
        previous_end = image.end
    return images
