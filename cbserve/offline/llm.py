"""`LLM`: vLLM's offline inference API over the pipeline's own scheduler and model runner, in this process.

The model is loaded as `python -m gpu_worker` loads it and scheduled by the batcher's `Scheduler` with
the batcher's defaults (token budget, chunked prefill, prefix caching), so greedy output is the served
pipeline's, token for token, without Redis, the gateway or other processes. Prompts are tokenized,
conversations templated and tokens turned back into text by the gateway's code.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

from cbserve.offline.engine import LLMEngine
from cbserve.offline.engine_args import model_directory, refuse_unsupported, scheduler_config, worker_settings
from cbserve.offline.lora_request import LoRARequests, check_adapters, per_prompt
from cbserve.offline.outputs import RequestOutput
from cbserve.offline.pooling_api import EventSink, PoolingAPI, pooling_options
from cbserve.offline.prompts import (
    Conversation,
    Prompt,
    PromptType,
    chat_prompts,
    generate_prompts,
    served_model,
)
from cbserve.offline.request_state import RequestState
from cbserve.offline.sampling_params import SamplingParams, for_engine, output_options
from common import protocol
from openai_frontend.completions.logprobs import LogprobsFormatter
from openai_frontend.model.tokenizer import ModelTokenizer
from openai_frontend.model.vision_processor import load_vision_processor
from openai_frontend.pooling.inputs import EmbeddingTokenizer, transformer_dir
from openai_frontend.pooling.pairs import PairTokenizer

Params = protocol.SamplingParams | Sequence[protocol.SamplingParams] | None


class LLM(PoolingAPI):
    def __init__(
        self,
        model: str,
        *,
        tokenizer: str | None = None,
        device: Literal["auto", "cpu", "cuda"] = "auto",
        dtype: str = "auto",
        seed: int = 0,
        max_model_len: int | None = None,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        block_size: int | None = None,
        num_blocks: int | None = None,
        kv_cache_memory_mb: int | None = None,
        gpu_memory_utilization: float | None = None,
        kv_cache_dtype: str | None = None,
        quantization: str | None = None,
        enforce_eager: bool = False,
        enable_prefix_caching: bool = True,
        async_scheduling: bool = False,
        enable_lora: bool = False,
        max_loras: int | None = None,
        max_lora_rank: int | None = None,
        max_cpu_loras: int | None = None,
        runner: Literal["auto", "generate", "pooling"] = "auto",
        convert: Literal["auto", "embed", "classify"] = "auto",
        hf_overrides: Mapping[str, Any] | None = None,
        pooler_config: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """`model` (and `tokenizer`, default the model's): a model directory or a hub id. The rest
        are the worker's settings of the same names (docs/settings.md); None leaves the worker's
        default, WORKER_* variables included. `device` auto: cuda when torch sees one.
        `enforce_eager`: no torch.compile, no CUDA graphs. `async_scheduling`: the next step is
        scheduled and its inputs built while the device runs the current one (engine.py). vLLM's
        arguments without a counterpart here are accepted at the value that asks for what runs
        anyway, refused at any other.
        `enable_lora` (with `max_loras`, `max_lora_rank`, `max_cpu_loras`): requests may run PEFT
        LoRA adapters (`generate(..., lora_request=...)`), batched with the base model's.
        `runner="pooling"` (vLLM's names, as `convert`, `pooler_config`'s pooling_type and normalize,
        and `hf_overrides`' classifier_from_token and is_matryoshka) serves `embed`, `classify` and
        `score` instead of `generate` (pooling_api.py)."""
        refuse_unsupported(kwargs)
        model_dir = model_directory(model)
        options = {
            "dtype": dtype,
            "seed": seed,
            "max_model_len": max_model_len,
            "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max_num_batched_tokens,
            "block_size": block_size,
            "num_blocks": num_blocks,
            "kv_cache_memory_mb": kv_cache_memory_mb,
            "gpu_memory_utilization": gpu_memory_utilization,
            "kv_cache_dtype": kv_cache_dtype,
            "quantization": quantization,
            "enable_lora": enable_lora,
            "max_loras": max_loras,
            "max_lora_rank": max_lora_rank,
            "max_cpu_loras": max_cpu_loras,
            **pooling_options(runner, convert, hf_overrides, pooler_config),
        }
        settings = worker_settings(model_dir, device, options, enforce_eager)
        self._model_dir = model_dir
        self._lora = settings.enable_lora, settings.max_lora_rank
        self.llm_engine = LLMEngine.load(settings, scheduler_config(enable_prefix_caching, async_scheduling))
        tokenizer_dir = transformer_dir(model_dir) if tokenizer is None else model_directory(tokenizer)
        self._served = served_model(model_dir, tokenizer_dir, self.llm_engine.max_model_len)
        self._embedding_tokenizer = EmbeddingTokenizer.load(model_dir, self._served.tokenizer)
        self._pair_tokenizer = PairTokenizer.load(tokenizer_dir, self._served.tokenizer)
        self._formatter = LogprobsFormatter(self._served.tokenizer.tokenizer)
        self._request_counter = itertools.count()
        # A vision-language model's processor: prompt dicts with "multi_modal_data" (mm_prompts.py).
        self._processor = (
            load_vision_processor(model_dir) if self.llm_engine.info.supports_multimodal else None
        )

    def get_tokenizer(self) -> ModelTokenizer:
        return self._served.tokenizer

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: Params = None,
        *,
        use_tqdm: bool = True,
        lora_request: LoRARequests = None,
    ) -> list[RequestOutput]:
        """One output per prompt, in the prompts' order. `prompts`: text (tokenized with the
        tokenizer's special tokens), token ids, vLLM's {"prompt": ...} / {"prompt_token_ids": ...},
        or a list of them; `sampling_params`: one for all, or one per prompt (default
        `SamplingParams()`: temperature 1, 16 tokens, as vLLM's, not the model's generation_config);
        `lora_request`: the adapter (`cbserve.LoRARequest`, vLLM's) for all, or one (or None) per prompt."""
        prompt_list = generate_prompts(prompts, self._served, self._processor)
        return self._run(prompt_list, sampling_params, use_tqdm, lora_request)

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        sampling_params: Params = None,
        *,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        lora_request: LoRARequests = None,
    ) -> list[RequestOutput]:
        """`generate` on one conversation (a list of OpenAI-style message dicts) or a list of them,
        rendered by the model's chat template (or `chat_template`) as `/v1/chat/completions` renders
        a body with the same fields."""
        prompts = chat_prompts(
            messages,
            self._served,
            chat_template=chat_template,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            chat_template_kwargs=chat_template_kwargs,
            tools=tools,
        )
        return self._run(prompts, sampling_params, use_tqdm, lora_request)

    def _run(
        self, prompts: list[Prompt], sampling_params: Params, use_tqdm: bool, lora_request: LoRARequests
    ) -> list[RequestOutput]:
        info = self.llm_engine.info
        if info.runner == "pooling":
            raise ValueError(
                f"model {info.model!r} is a pooling model ({', '.join(info.pooling_tasks)}): use "
                "LLM.embed, LLM.classify or LLM.score, not generate or chat"
            )
        params = _per_prompt(sampling_params, len(prompts))
        loras = per_prompt(lora_request, len(prompts))
        check_adapters(loras, self._model_dir, *self._lora)
        limit = self.llm_engine.max_model_len
        for i, prompt in enumerate(prompts):
            if len(prompt.token_ids) >= limit:
                raise ValueError(
                    f"prompt {i} has {len(prompt.token_ids)} tokens: max_model_len {limit} leaves no room "
                    "for output (shorten it, or raise max_model_len)"
                )
        tokenizer = self._served.tokenizer
        states = [
            RequestState(str(next(self._request_counter)), prompt, p, tokenizer, self._formatter)
            for prompt, p in zip(prompts, params, strict=True)
        ]
        for state, lora in zip(states, loras, strict=True):
            self.llm_engine.add_request(
                state.request_id,
                state.prompt.token_ids,
                for_engine(state.params),
                lora,
                mm_features=state.prompt.mm_features,
            )
        self._run_engine({state.request_id: state for state in states}, use_tqdm)
        return [state.output() for state in states]

    def _run_engine(self, states: Mapping[str, EventSink], use_tqdm: bool) -> None:
        """Step until every request finished. A request that fails raises (as vLLM's engine does),
        after the others are aborted, so the engine is ready for the next call."""
        engine = self.llm_engine
        try:
            with _progress_bar(len(states), use_tqdm) as advance:
                while engine.has_unfinished_requests():
                    step = engine.step()
                    num_finished = 0
                    for event in step.events:
                        state = states.get(event.req_id)
                        if state is None or not state.on_event(event):
                            continue
                        num_finished += 1
                        if state.stop_string_hit:
                            engine.abort_request(state.request_id, "stop")
                    failed = next((req for req in step.finished if req.finish_reason == "error"), None)
                    if failed is not None:
                        raise RuntimeError(f"request {failed.req_id} failed: {failed.error}")
                    if not step.ran and not step.finished:
                        raise RuntimeError("the scheduler holds requests but scheduled none of them")
                    if num_finished:
                        advance(num_finished)
        except BaseException:
            for req_id in states:
                engine.abort_request(req_id)
            raise


def _per_prompt(sampling_params: Params, num_prompts: int) -> list[SamplingParams]:
    if sampling_params is None:
        return [SamplingParams()] * num_prompts
    if isinstance(sampling_params, protocol.SamplingParams):
        return [output_options(sampling_params)] * num_prompts
    if len(sampling_params) != num_prompts:
        raise ValueError(
            f"{len(sampling_params)} sampling_params for {num_prompts} prompts: give one, or one per prompt"
        )
    return [output_options(p) for p in sampling_params]


@contextlib.contextmanager
def _progress_bar(total: int, enabled: bool) -> Iterator[Callable[[int], object]]:
    """vLLM's bar of the prompts done (tqdm, which transformers depends on, when it is installed)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        enabled = False
    if not enabled:
        yield lambda n: None
        return
    with tqdm(total=total, desc="Processed prompts", unit="prompt", dynamic_ncols=True) as bar:
        yield bar.update
