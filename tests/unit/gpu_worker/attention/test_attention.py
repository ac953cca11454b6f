"""paged_attention_forward: the variant transformers asks for, kwargs it refuses; the backend setting."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gpu_worker.runner.attention.transformers_interface import paged_attention_forward, variant_of
from gpu_worker.settings import WorkerSettings


@pytest.mark.parametrize(
    ("name", "value"), [("position_bias", torch.zeros(1, 4, 3, 3)), ("indices", torch.zeros(3))]
)
def test_unimplemented_attention_kwargs_are_refused(name: str, value: object) -> None:
    q, kv = torch.zeros(1, 4, 3, 8), torch.zeros(1, 2, 3, 8)
    context = SimpleNamespace(common=SimpleNamespace(max_seq_len=5000))
    with pytest.raises(NotImplementedError, match=name):
        paged_attention_forward(
            torch.nn.Linear(1, 1), q, kv, kv, None, scaling=1.0, attn_metadata=context, **{name: value}
        )


def test_window_softcap_and_sinks_become_the_layers_variant() -> None:
    sinks = torch.zeros(4)
    gpt_oss = variant_of({"sliding_window": 128, "s_aux": sinks})
    assert (gpt_oss.window, gpt_oss.softcap, gpt_oss.sinks) == (128, None, sinks)
    gemma2 = variant_of({"sliding_window": None, "softcap": 50})
    assert (gemma2.window, gemma2.softcap, gemma2.sinks) == (None, 50.0, None)
    assert variant_of({"sinks": sinks}).sinks is sinks
    assert variant_of({}).is_plain


def test_attention_backend_defaults_by_device() -> None:
    assert WorkerSettings(model="m", device="cpu").resolved_attention_backend == "torch"
    assert WorkerSettings(model="m", device="cuda").resolved_attention_backend == "triton"
    assert WorkerSettings(model="m", attention_backend="triton").resolved_attention_backend == "triton"
