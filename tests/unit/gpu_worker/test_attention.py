"""paged_attention_forward refuses attention variants it does not implement; the backend setting."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gpu_worker.attention import paged_attention_forward
from gpu_worker.settings import WorkerSettings


@pytest.mark.parametrize(
    ("name", "value"),
    [("sliding_window", 4096), ("softcap", 50.0), ("s_aux", torch.zeros(4)), ("sinks", torch.zeros(4))],
)
def test_unimplemented_attention_kwargs_are_refused(name: str, value: object) -> None:
    q, kv = torch.zeros(1, 4, 3, 8), torch.zeros(1, 2, 3, 8)
    # A step with a sequence longer than the window: there the window would slide.
    context = SimpleNamespace(common=SimpleNamespace(max_seq_len=5000))
    with pytest.raises(NotImplementedError, match=name):
        paged_attention_forward(
            torch.nn.Linear(1, 1), q, kv, kv, None, scaling=1.0, attn_metadata=context, **{name: value}
        )


def test_attention_backend_defaults_by_device() -> None:
    assert WorkerSettings(model="m", device="cpu").resolved_attention_backend == "torch"
    assert WorkerSettings(model="m", device="cuda").resolved_attention_backend == "triton"
    assert WorkerSettings(model="m", attention_backend="triton").resolved_attention_backend == "triton"
