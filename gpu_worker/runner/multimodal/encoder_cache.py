"""The worker's encoder cache (vLLM's `encoder_cache` in gpu_model_runner.py): each image's embeddings,
keyed by its content hash (`MultiModalFeature.identifier`), so an image sent again, or the next
prefill chunk of the same image, is not encoded again.

Bounded by embedding tokens (vLLM's `encoder_cache_size`), least recently used out first. A step holds
the outputs it uses in its own dict, so evicting one while the step runs frees nothing it reads.
"""

from __future__ import annotations

from collections import OrderedDict

import torch


class EncoderCache:
    def __init__(self, max_num_tokens: int) -> None:
        self.max_num_tokens = max_num_tokens
        self._outputs: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._num_tokens = 0
        self.num_encoder_runs = 0  # images encoded (cumulative)
        self.num_cache_hits = 0  # images a step needed and found here (cumulative)

    def get(self, identifier: str) -> torch.Tensor | None:
        """The cached output, marked recently used; counts a hit."""
        output = self._outputs.get(identifier)
        if output is not None:
            self._outputs.move_to_end(identifier)
            self.num_cache_hits += 1
        return output

    def put(self, identifier: str, output: torch.Tensor) -> None:
        """Keep a fresh output [tokens, hidden] (counted as an encoder run), evicting the least
        recently used ones past the bound; one larger than the bound is used by its step, not kept."""
        self.num_encoder_runs += 1
        num_tokens = int(output.shape[0])
        if num_tokens > self.max_num_tokens:
            return
        old = self._outputs.pop(identifier, None)
        if old is not None:
            self._num_tokens -= int(old.shape[0])
        while self._outputs and self._num_tokens + num_tokens > self.max_num_tokens:
            _, evicted = self._outputs.popitem(last=False)
            self._num_tokens -= int(evicted.shape[0])
        self._outputs[identifier] = output
        self._num_tokens += num_tokens

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    def __len__(self) -> int:
        return len(self._outputs)
