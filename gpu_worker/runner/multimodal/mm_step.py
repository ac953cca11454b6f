"""The images' part of a step (vLLM's gpu_model_runner `_execute_mm_encoder` and
`_gather_mm_embeddings`): encode the images whose placeholder tokens the step computes and that the
encoder cache lacks, then build the step's input embeddings with each image's slice at its tokens.

A prefill chunk may cover part of an image's placeholder run (the batcher splits LLaVA's and
Qwen2.5-VL's where the token budget ends): the chunk takes the rows of the image's output for the
tokens it computes, and the next chunk finds the output in the cache.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from common.protocol import MultiModalFeature, NewRequestData
from gpu_worker.runner.input_batch import InputBatch, ScheduledRequest
from gpu_worker.runner.multimodal.encoder_cache import EncoderCache
from gpu_worker.runner.multimodal.mm_inputs import ImageInput, image_inputs
from gpu_worker.runner.multimodal.mrope import mrope_positions, step_mrope_positions
from gpu_worker.runner.multimodal.vision_model import VisionLanguageModel


def add_images(mm: MultiModalInputs | None, new: NewRequestData, model_name: str) -> str | None:
    """Take in a new request's images, decoded and checked; why not, when they cannot be."""
    if mm is None:
        return f"model {model_name!r} takes no images: it is not a vision-language model"
    try:
        mm.add(new.req_id, new.mm_features, len(new.prompt_token_ids))
    except ValueError as exc:
        return str(exc)
    return None


class MultiModalInputs:
    """The images of the requests a worker holds, and the encoder cache they share."""

    def __init__(self, model: VisionLanguageModel, encoder_cache_size: int, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.encoder_cache = EncoderCache(encoder_cache_size)
        self._images: dict[str, list[ImageInput]] = {}  # req_id -> its images, in prompt order
        # req_id -> (prompt positions [P, 3], delta) with M-RoPE; every request has them then.
        self._mrope: dict[str, tuple[torch.Tensor | None, int]] = {}
        self._num_prompt_tokens: dict[str, int] = {}

    def add(self, req_id: str, features: Sequence[MultiModalFeature] | None, num_prompt_tokens: int) -> None:
        """A new request's images (ValueError when they do not fit its prompt)."""
        images = image_inputs(features or [], num_prompt_tokens)
        if images:
            self._images[req_id] = images
        if self.model.mrope:
            self._num_prompt_tokens[req_id] = num_prompt_tokens
            if images:
                positions, delta = mrope_positions(num_prompt_tokens, images, self.model.spatial_merge_size)
                self._mrope[req_id] = (positions, delta)
            else:
                self._mrope[req_id] = (None, 0)

    def remove(self, req_id: str) -> None:
        self._images.pop(req_id, None)
        self._mrope.pop(req_id, None)
        self._num_prompt_tokens.pop(req_id, None)

    def clear(self) -> None:
        self._images.clear()
        self._mrope.clear()
        self._num_prompt_tokens.clear()

    def bidirectional_runs(self, scheduled: Sequence[ScheduledRequest]) -> dict[str, list[tuple[int, int]]]:
        """Gemma 3: req_id -> the placeholder runs (start, end) that the step's chunk of it computes,
        whose tokens see their whole run; empty for other families and steps without images."""
        if not self.model.bidirectional_images:
            return {}
        runs: dict[str, list[tuple[int, int]]] = {}
        for r in scheduled:
            begin = r.state.num_computed_tokens
            end = begin + r.num_tokens
            overlap = [
                (i.offset, i.end)
                for i in self._images.get(r.state.req_id, [])
                if i.offset < end and i.end > begin
            ]
            if overlap:
                runs[r.state.req_id] = overlap
        return runs

    def inputs_embeds(self, batch: InputBatch) -> torch.Tensor:
        """The step's input embeddings [1, T, hidden], images merged at their placeholder tokens."""
        embeds = self.model.embed(batch.input_ids[0])
        starts = batch.attn_metadata.common.query_start_loc_cpu.tolist()
        rows: list[torch.Tensor] = []
        slots: list[int] = []
        for r, first in zip(batch.scheduled, starts, strict=False):
            begin = r.state.num_computed_tokens
            end = begin + r.num_tokens
            for image in self._images.get(r.state.req_id, []):
                if image.end <= begin or image.offset >= end:
                    continue
                lo, hi = max(begin, image.offset), min(end, image.end)
                rows.append(self._encoder_output(image)[lo - image.offset : hi - image.offset])
                slots.extend(range(first + lo - begin, first + hi - begin))
        if rows:
            index = torch.tensor(slots, dtype=torch.long, device=embeds.device)
            embeds = embeds.index_copy(0, index, torch.cat(rows).to(embeds.dtype))
        return embeds.unsqueeze(0)

    def positions(self, batch: InputBatch) -> torch.Tensor:
        """The step's positions: [1, T] as the batch has them, or [1, T, 3] with M-RoPE."""
        if not self.model.mrope:
            return batch.position_ids
        parts = []
        for r in batch.scheduled:
            begin = r.state.num_computed_tokens
            indexes = torch.arange(begin, begin + r.num_tokens)
            prompt_positions, delta = self._mrope.get(r.state.req_id, (None, 0))
            parts.append(step_mrope_positions(indexes, prompt_positions, r.state.num_prompt_tokens, delta))
        positions = torch.cat(parts) if parts else torch.zeros(0, 3, dtype=torch.long)
        return positions.unsqueeze(0).to(self.device)

    def _encoder_output(self, image: ImageInput) -> torch.Tensor:
        """Its embeddings [length, hidden]: from the cache, else encoded now and cached."""
        output = self.encoder_cache.get(image.identifier)
        if output is not None:
            return output
        data = {name: t.to(self.device) for name, t in image.data.items()}
        output = self.model.encode(data)
        if output.shape[0] != image.length:
            raise ValueError(
                f"image {image.identifier[:12]}: the vision encoder gave {output.shape[0]} embeddings "
                f"for {image.length} placeholder tokens"
            )
        self.encoder_cache.put(image.identifier, output)
        return output
