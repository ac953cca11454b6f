"""A causal LM as a pooling model: the paged, chunked forward the worker generates with, returning at
the rows asked (`logits_to_keep`) the final-norm hidden states (embed) or a classifier's logits
(classify) instead of the LM head's.

The worker's own `Decoder` (compiled, merged GEMMs) runs the families it implements, with its LM head
swapped: none for embeddings; the model's `score` head for a `*ForSequenceClassification`; for a
decoder reranker (vLLM's `classifier_from_token`) one row, the "yes" token's LM-head row minus the
"no" token's, whose sigmoid is the softmax over the two tokens' logits (vLLM's conversion). Other
architectures run transformers' own base model with paged attention plugged in, under the same head.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    GenerationConfig,
    PretrainedConfig,
    PreTrainedModel,
)

from gpu_worker.runner.attention.backend import AttentionContext
from gpu_worker.runner.attention.transformers_interface import register_paged_attention
from gpu_worker.runner.forward.compile import compile_decoder, pool_layout
from gpu_worker.runner.forward.decoder import FAMILIES, Decoder, DecoderOutput
from gpu_worker.runner.forward.linear import check_quantization
from gpu_worker.runner.load_model import Model
from gpu_worker.runner.pooling.model_files import PoolingSpec
from gpu_worker.settings import WorkerSettings


@dataclass(slots=True)
class _Headed:
    """What `Decoder` reads of a causal LM: its base model and a head in place of the LM head."""

    model: PreTrainedModel
    lm_head: nn.Linear
    config: PretrainedConfig
    dtype: torch.dtype
    device: torch.device
    generation_config: GenerationConfig | None


class HiddenStatesForward(nn.Module):
    """transformers' base model (paged attention plugged in) called as the runner calls a model."""

    def __init__(self, base: PreTrainedModel, head: nn.Module) -> None:
        super().__init__()
        self.base = base
        self.head = head
        self.config = base.config
        self.dtype = base.dtype
        self.generation_config = getattr(base, "generation_config", None)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        logits_to_keep: torch.Tensor,
        attn_metadata: AttentionContext,
        use_cache: bool = False,
    ) -> DecoderOutput:
        out = self.base(
            input_ids=input_ids, position_ids=position_ids, use_cache=False, attn_metadata=attn_metadata
        )
        hidden = out.last_hidden_state[0].index_select(0, logits_to_keep)
        return DecoderOutput(logits=self.head(hidden).unsqueeze(0))


def load_causal_pooling_model(settings: WorkerSettings, spec: PoolingSpec) -> Model:
    """The model with its pooling head, on its device, compiled like the generating worker's."""
    device = torch.device(settings.device)
    check_quantization(settings.quantization, device)
    base, head = _base_and_head(settings, spec)
    base.to(device)  # type: ignore[arg-type]
    base.eval()
    if head is not None:
        head.to(device=device, dtype=base.dtype)
    if spec.config.model_type not in FAMILIES:
        if settings.quantization is not None:
            raise ValueError(f"WORKER_QUANTIZATION is implemented for {', '.join(sorted(FAMILIES))}")
        return cast(Model, HiddenStatesForward(base, nn.Identity() if head is None else head))
    hidden = base.config.hidden_size
    placeholder = nn.Linear(hidden, 1, bias=False, device=device, dtype=base.dtype)
    shim = _Headed(base, head or placeholder, base.config, base.dtype, device, None)
    decoder = Decoder(cast(Any, shim), settings.quantization)
    if head is None:
        decoder.lm_head = cast(Any, nn.Identity())  # embeddings: the final norm's output itself
    decoder.pool_layout = pool_layout(settings)
    if settings.compile:
        compile_decoder(decoder, Path(settings.compile_cache_dir), device)
    return decoder


def _base_and_head(settings: WorkerSettings, spec: PoolingSpec) -> tuple[PreTrainedModel, nn.Linear | None]:
    """The base model (no LM head) and the classifier head, None for embeddings."""
    kwargs: dict[str, Any] = {
        "attn_implementation": register_paged_attention(),
        "dtype": getattr(torch, settings.resolved_dtype),
    }
    path = spec.model_dir
    if spec.classifier_from_token is not None:
        lm = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        no, yes = _token_ids(path, spec.classifier_from_token)
        weight = lm.get_output_embeddings().weight
        head = nn.Linear(weight.shape[1], 1, bias=False, dtype=weight.dtype)
        with torch.no_grad():
            head.weight.copy_((weight[yes] - weight[no]).unsqueeze(0))
        return cast(PreTrainedModel, lm.base_model), head
    if spec.classifier:
        cls_model = AutoModelForSequenceClassification.from_pretrained(path, **kwargs)
        score = getattr(cls_model, "score", None)
        if not isinstance(score, nn.Linear):
            raise ValueError(f"{type(cls_model).__name__} has no linear `score` head over the last token")
        return cast(PreTrainedModel, cls_model.base_model), score
    return AutoModel.from_pretrained(path, **kwargs), None


def _token_ids(path: Path, tokens: tuple[str, str]) -> tuple[int, int]:
    tokenizer = AutoTokenizer.from_pretrained(path)
    ids = [tokenizer.convert_tokens_to_ids(token) for token in tokens]
    found = [i for i in ids if isinstance(i, int) and i != tokenizer.unk_token_id]
    if len(found) != len(tokens):
        raise ValueError(f"classifier_from_token: {list(tokens)} are not both tokens of {path}'s tokenizer")
    return found[0], found[1]
