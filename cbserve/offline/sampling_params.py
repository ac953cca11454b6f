"""What one offline request asks for: the pipeline's sampling parameters, the front end's output options."""

from __future__ import annotations

from typing import Any

from common import protocol
from openai_frontend.generate.validation import stop_strings
from openai_frontend.protocol.errors import OpenAIError


class SamplingParams(protocol.SamplingParams, frozen=True, kw_only=True):
    """`common.protocol.SamplingParams` (what the worker samples with, max_tokens 16 by default as in
    vLLM) plus what the gateway applies to the output text and keeps beside them (PreparedRequest):
    stop strings, and vLLM's `include_stop_str_in_output` and `skip_special_tokens`. A plain
    `common.protocol.SamplingParams` is accepted too. vLLM's other fields (`n`, `best_of`, ...) are not
    fields here: passing one is a TypeError that names it."""

    stop: str | list[str] | None = None  # matched on the output text; the text is cut before it
    include_stop_str_in_output: bool = False  # the stop string (or EOS / stop token) stays in the text
    skip_special_tokens: bool = True  # special tokens are left out of the text

    def __post_init__(self) -> None:
        try:
            stop_strings(self.stop)  # the gateway's bounds on stop strings
        except OpenAIError as exc:
            raise ValueError(exc.message) from None

    @property
    def stop_strings(self) -> list[str]:
        return stop_strings(self.stop)


def output_options(params: protocol.SamplingParams) -> SamplingParams:
    """`params` with its output options: the defaults for the pipeline's own class."""
    return params if isinstance(params, SamplingParams) else SamplingParams(**_wire_fields(params))


def for_engine(params: SamplingParams) -> protocol.SamplingParams:
    """What the scheduler and the worker get: the wire message's fields alone, as from Redis."""
    return protocol.SamplingParams(**_wire_fields(params))


def _wire_fields(params: protocol.SamplingParams) -> dict[str, Any]:
    return {name: getattr(params, name) for name in protocol.SamplingParams.__struct_fields__}
