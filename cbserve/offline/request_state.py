"""One request's output as its token events arrive: the text by the gateway's own rules (incremental
detokenizing, EOS hidden, stop strings cut), logprobs in vLLM's shape, and the RequestOutput at the end."""

from __future__ import annotations

from cbserve.offline.outputs import CompletionOutput, Logprob, PromptLogprobs, RequestOutput, SampleLogprobs
from cbserve.offline.prompts import Prompt
from cbserve.offline.sampling_params import SamplingParams
from common.protocol import PoolingEvent, PromptEvent, WorkerEvent
from openai_frontend.completions.logprobs import LogprobsFormatter
from openai_frontend.model.tokenizer import ModelTokenizer
from openai_frontend.text.output_processor import OutputProcessor


class RequestState:
    def __init__(
        self,
        request_id: str,
        prompt: Prompt,
        params: SamplingParams,
        tokenizer: ModelTokenizer,
        formatter: LogprobsFormatter,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self._tokenizer = tokenizer.tokenizer
        self._formatter = formatter  # a token's own text, for its logprobs
        self._processor = OutputProcessor(
            tokenizer,
            prompt.token_ids,
            params.stop_strings,
            skip_special_tokens=params.skip_special_tokens,
            include_stop=params.include_stop_str_in_output,
        )
        self.token_ids: list[int] = []
        self.logprobs: SampleLogprobs | None = None if params.logprobs is None else []
        self.cumulative_logprob = 0.0
        self.prompt_logprobs: PromptLogprobs | None = None
        self.num_cached_tokens = 0
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        # A stop string ended it while the engine goes on: the engine must be told to stop it.
        self.stop_string_hit = False

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def on_event(self, event: WorkerEvent) -> bool:
        """Apply one of the request's events; True when it finished the request. Events after the
        end (drafts accepted past a stop string) and repeated ones are left out."""
        if self.finished or isinstance(event, PoolingEvent):
            return False
        if isinstance(event, PromptEvent):
            return self._on_prompt(event)
        if event.index != len(self.token_ids):
            return False
        self.token_ids.append(event.token_id)
        if event.index == 0:
            self.num_cached_tokens = event.num_cached_tokens
        if self.logprobs is not None:
            logprob = event.logprob or 0.0
            self.cumulative_logprob += logprob
            entry = self._position(event.token_id, logprob, event.top_token_ids, event.top_logprobs)
            self.logprobs.append(entry)
        delta = self._processor.process(event.token_id, event.finish_reason)
        if delta.finish_reason is None:
            return False
        self.finish_reason = delta.finish_reason
        self.stop_string_hit = delta.stop_string_hit
        if self.finish_reason == "stop":
            # The worker's "stop" is EOS or a stop token id; the front end's, a stop string.
            worker_stopped = event.finish_reason == "stop"
            self.stop_reason = self._stop_token(event.token_id) if worker_stopped else self._stop_string()
        return True

    def _on_prompt(self, event: PromptEvent) -> bool:
        if self.params.prompt_logprobs is not None:
            positions = zip(
                event.token_ids[1:], event.logprobs, event.top_token_ids, event.top_logprobs, strict=True
            )
            self.prompt_logprobs = [None, *(self._position(*position) for position in positions)]
        if event.finish_reason is None:
            return False
        self.finish_reason = event.finish_reason  # it generates nothing (max_tokens 0)
        self.num_cached_tokens = event.num_cached_tokens
        return True

    def _position(
        self, token_id: int, logprob: float, top_token_ids: list[int], top_logprobs: list[float]
    ) -> dict[int, Logprob]:
        """vLLM's entry for one position: the token itself first, then the most likely ones."""
        top = {
            t: Logprob(lp, rank, self._formatter.token_text(t))
            for rank, (t, lp) in enumerate(zip(top_token_ids, top_logprobs, strict=True), 1)
        }
        rank = top.pop(token_id).rank if token_id in top else None
        return {token_id: Logprob(logprob, rank, self._formatter.token_text(token_id)), **top}

    def _stop_token(self, token_id: int) -> int | None:
        return token_id if token_id in self.params.stop_token_ids else None

    def _stop_string(self) -> str | None:
        """The stop string the output text met first (the matcher's choice: earliest, then smallest)."""
        text = self._tokenizer.decode(self.token_ids, skip_special_tokens=self.params.skip_special_tokens)
        hits = [(text.find(stop), stop) for stop in self.params.stop_strings if stop in text]
        return min(hits)[1] if hits else None

    def output(self) -> RequestOutput:
        completion = CompletionOutput(
            index=0,
            text=self._processor.text,
            token_ids=list(self.token_ids),
            cumulative_logprob=None if self.logprobs is None else self.cumulative_logprob,
            logprobs=self.logprobs,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
        )
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt.text,
            prompt_token_ids=self.prompt.token_ids,
            prompt_logprobs=self.prompt_logprobs,
            outputs=[completion],
            finished=self.finished,
            num_cached_tokens=self.num_cached_tokens,
        )
