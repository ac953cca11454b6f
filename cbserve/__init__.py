"""`cbserve`: one-command launcher (`cbserve up`), terminal clients (`chat`, `complete`), and `LLM`, the
engine in this process for offline work (`from cbserve import LLM, LoRARequest, SamplingParams`).

`LLM`, `LoRARequest` and `SamplingParams` are imported on first use: the launcher imports this
package, and loading torch for it would slow every `cbserve` command.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cbserve.offline.llm import LLM
    from cbserve.offline.lora_request import LoRARequest
    from cbserve.offline.sampling_params import SamplingParams

__all__ = ["LLM", "LoRARequest", "SamplingParams"]

_LAZY = {
    "LLM": "cbserve.offline.llm",
    "LoRARequest": "cbserve.offline.lora_request",
    "SamplingParams": "cbserve.offline.sampling_params",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cbserve' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
