"""Structured outputs on the worker: one xgrammar matcher per constrained request, whose token bitmask
masks the logits before sampling (vLLM's and SGLang's approach, with xgrammar as in their default).

- Grammars are compiled against the model's vocabulary once per (kind, spec) and kept in a bounded
  LRU cache, so the `n` choices of a request, and every request with the same schema, share one.
- A matcher is built when its request arrives and fed the request's output tokens so far, so a
  request recomputed after preemption or failover resumes in the grammar state its text is in.
- Each step fills the bitmasks of all its constrained rows in one call, copies them to the logits'
  device in one transfer, and the sampler applies them after logit_bias (`GrammarMask`).
- A step's drafts (speculative decoding) are checked against the grammar: each draft row is masked
  with the state after the drafts before it, so a draft the grammar refuses is never accepted.
- After sampling, each constrained request's tokens (accepted drafts, then the sample) are accepted
  into its matcher; a matcher that terminates (its grammar is complete and a stop token was sampled)
  ends the request with "stop".
- JSON rows also lose every token holding a control character (bytes below 0x20): JSON allows none
  raw, our JSON has no free whitespace, and xgrammar 0.2 lets them into strings with a `maxLength`.
- A JSON row whose model would end its turn before the JSON is complete has that probability moved
  onto the tokens that close what is open (`json_closing.py`), unless its request ignores EOS.

The tokenizer (transformers' AutoTokenizer, for xgrammar's TokenizerInfo) and the compiler are
loaded on the first structured request: a worker that never sees one never pays for them.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from common.grammar import GrammarError, build_grammar
from common.protocol import FinishReason, StructuredOutput
from gpu_worker.runner.structured_output.json_closing import JsonClosing, closer_tiers

logger = logging.getLogger(__name__)

GRAMMAR_CACHE_SIZE = 64  # compiled grammars kept; each holds per-token masks of its states


@dataclass(slots=True, frozen=True)
class GrammarMask:
    """The step's grammar masks: `bitmask` [N, ceil(V / 32)] int32 on the logits' device, bit j of
    row i set when token j is allowed; only `rows` (constrained logits rows) are read."""

    bitmask: torch.Tensor
    rows: list[int]
    vocab_size: int
    closing: JsonClosing | None = None  # the JSON rows whose wish to stop closes the JSON

    def apply(self, logits: torch.Tensor) -> None:
        """Sets, in place, every token the grammar forbids to -inf on the constrained rows (after moving
        the JSON rows' probability of a forbidden stop onto their closing tokens)."""
        import xgrammar as xgr

        if self.closing is not None:
            self.closing.apply(logits, self.bitmask)
        xgr.apply_token_bitmask_inplace(logits, self.bitmask, vocab_size=self.vocab_size, indices=self.rows)


class GrammarCache:
    """Compiled grammars by StructuredOutput, least recently used evicted past `capacity`."""

    def __init__(self, compiler: Any, capacity: int = GRAMMAR_CACHE_SIZE) -> None:
        self._compiler = compiler
        self._capacity = capacity
        self._compiled: OrderedDict[StructuredOutput, Any] = OrderedDict()
        self.num_compiled = 0  # compilations done (cache misses)

    def get(self, output: StructuredOutput) -> Any:
        compiled = self._compiled.get(output)
        if compiled is not None:
            self._compiled.move_to_end(output)
            return compiled
        compiled = self._compiler.compile_grammar(build_grammar(output))
        self.num_compiled += 1
        self._compiled[output] = compiled
        if len(self._compiled) > self._capacity:
            self._compiled.popitem(last=False)
        return compiled


class StructuredOutputs:
    """The matchers of the constrained requests a worker holds, by req_id."""

    def __init__(
        self, model_dir: str, vocab_size: int, stop_token_ids: Collection[int], device: torch.device
    ) -> None:
        self._model_dir = model_dir
        self.vocab_size = vocab_size  # the model's: it may exceed the tokenizer's (padded embeddings)
        self._stop_token_ids = sorted(stop_token_ids)
        self._device = device
        self._cache: GrammarCache | None = None
        self._batch_matcher: Any = None
        self._matchers: dict[str, Any] = {}
        self._json_rows: set[str] = set()  # requests whose output is JSON
        self._closing_rows: set[str] = set()  # JSON requests that do not ignore EOS (json_closing.py)
        self._no_control_bytes = torch.zeros(0, dtype=torch.int32)  # bitmask row, set on load
        self._closer_tiers = torch.zeros(3, 0, dtype=torch.bool)  # on the device, set on load
        self._stop_ids = torch.tensor(self._stop_token_ids, dtype=torch.long, device=device)
        self._bitmask = torch.zeros(0, 0, dtype=torch.int32)  # host buffer, pinned on cuda

    def __len__(self) -> int:
        return len(self._matchers)

    @property
    def cache(self) -> GrammarCache:
        if self._cache is None:
            self._cache = self._load()
        return self._cache

    def _load(self) -> GrammarCache:
        import xgrammar as xgr
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self._model_dir)
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=self.vocab_size, stop_token_ids=self._stop_token_ids
        )
        self._no_control_bytes = _bitmask_row(
            [not any(b < 0x20 for b in token) for token in info.decoded_vocab], self.vocab_size
        )
        self._closer_tiers = closer_tiers(info.decoded_vocab, self.vocab_size).to(self._device)
        threads = max(1, torch.get_num_threads())
        self._batch_matcher = xgr.BatchGrammarMatcher(max_threads=threads)
        # Our own LRU caches compiled grammars; xgrammar's cache would hold a second copy.
        return GrammarCache(xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False))

    def add(
        self,
        req_id: str,
        output: StructuredOutput,
        output_token_ids: Sequence[int],
        ignore_eos: bool = False,
    ) -> str | None:
        """A matcher for `req_id`, advanced over the tokens it already generated; an error if its
        grammar does not compile or those tokens do not follow it."""
        import xgrammar as xgr

        self.remove(req_id)
        try:
            compiled = self.cache.get(output)
        except GrammarError as exc:
            return f"invalid {output.kind} grammar: {exc}"
        matcher = xgr.GrammarMatcher(compiled)
        for index, token_id in enumerate(output_token_ids):
            if not matcher.accept_token(token_id):
                return f"output token {token_id} at index {index} does not follow the request's grammar"
        self._matchers[req_id] = matcher
        if output.kind in ("json", "json_object"):
            self._json_rows.add(req_id)
            if not ignore_eos:
                self._closing_rows.add(req_id)
        return None

    def remove(self, req_id: str) -> None:
        self._matchers.pop(req_id, None)
        self._json_rows.discard(req_id)
        self._closing_rows.discard(req_id)

    def clear(self) -> None:
        self._matchers.clear()
        self._json_rows.clear()
        self._closing_rows.clear()

    def constrains(self, req_ids: Sequence[str]) -> bool:
        """Whether any of `req_ids` samples under a grammar."""
        return bool(self._matchers) and any(req_id in self._matchers for req_id in req_ids)

    def masks(
        self, req_ids: Sequence[str], drafts: Sequence[tuple[str, Sequence[int]]]
    ) -> tuple[GrammarMask | None, GrammarMask | None]:
        """The bitmasks of a step's sampling rows (`req_ids`) and of its draft rows (each drafting
        request's drafts in order, as `drafts` lists them); None where none is constrained.

        A draft row's mask is the grammar's state after the drafts before it, and a drafting request's
        sampling row (its bonus token) comes after all of them. A row after a draft the grammar refuses,
        or one that ends it, is never reached (the run stops at that draft, or at its stop token), and
        gets the mask of the last row that is. The matchers are left as they were."""
        if not self._matchers:
            return None, None
        import xgrammar as xgr

        draft_rows: list[int] = []
        after_drafts: dict[str, torch.Tensor] = {}  # the bonus row of each constrained drafting request
        draft_bits = torch.zeros(0, dtype=torch.int32)
        if any(req_id in self._matchers for req_id, _ in drafts):
            draft_bits = xgr.allocate_token_bitmask(sum(len(d) for _, d in drafts), self.vocab_size)
        start = 0
        for req_id, tokens in drafts:
            matcher = self._matchers.get(req_id)
            if matcher is not None:
                after_drafts[req_id] = self._fill_through(matcher, tokens, draft_bits, start)
                draft_rows.extend(range(start, start + len(tokens)))
            start += len(tokens)
        rows = [i for i, req_id in enumerate(req_ids) if req_id in self._matchers]
        plain = [i for i in rows if req_ids[i] not in after_drafts]
        bitmask = self._host_bitmask(len(req_ids))
        if plain:
            matchers = [self._matchers[req_ids[i]] for i in plain]
            self._batch_matcher.batch_fill_next_token_bitmask(matchers, bitmask, indices=plain)
        for i in rows:
            if req_ids[i] in after_drafts:
                bitmask[i] = after_drafts[req_ids[i]]
        draft_ids = [req_id for req_id, tokens in drafts for _ in tokens]
        sampling_mask = self._grammar_mask(bitmask, rows, req_ids)
        return sampling_mask, self._grammar_mask(draft_bits, draft_rows, draft_ids)

    def _fill_through(
        self, matcher: Any, tokens: Sequence[int], bitmask: torch.Tensor, start: int
    ) -> torch.Tensor:
        """Fills rows start.. of `bitmask` for `tokens` (drafts) taken in turn, and returns the mask
        after them all; the matcher is rolled back to where it was."""
        reachable, last, accepted = True, None, 0
        for i, token_id in enumerate(tokens):
            row = start + i
            if not reachable:
                bitmask[row] = bitmask[last]
                continue
            matcher.fill_next_token_bitmask(bitmask, row)
            last = row
            if matcher.accept_token(token_id):
                accepted += 1
                reachable = not matcher.is_terminated()
            else:
                reachable = False
        if reachable:
            after = torch.empty_like(bitmask[:1])
            matcher.fill_next_token_bitmask(after, 0)
            after = after[0]
        else:
            after = bitmask[last].clone()
        matcher.rollback(accepted)
        return after

    def _grammar_mask(
        self, bitmask: torch.Tensor, rows: list[int], req_ids: Sequence[str]
    ) -> GrammarMask | None:
        if not rows:
            return None
        json_rows = [i for i in rows if req_ids[i] in self._json_rows]
        if json_rows:
            bitmask[json_rows] &= self._no_control_bytes
        if self._device.type != "cpu":
            bitmask = bitmask.to(self._device, non_blocking=True)
        closing_rows = [i for i in rows if req_ids[i] in self._closing_rows]
        closing = None
        if closing_rows:
            closing = JsonClosing(closing_rows, self._closer_tiers, self._stop_ids)
        return GrammarMask(bitmask=bitmask, rows=rows, vocab_size=self.vocab_size, closing=closing)

    def _host_bitmask(self, num_rows: int) -> torch.Tensor:
        import xgrammar as xgr

        if self._bitmask.shape[0] < num_rows:
            rows = max(16, 2 * num_rows)
            bitmask = xgr.allocate_token_bitmask(rows, self.vocab_size)
            self._bitmask = bitmask.pin_memory() if self._device.type == "cuda" else bitmask
        return self._bitmask[:num_rows]

    def accept(self, req_ids: Sequence[str], runs: Sequence[list[int]]) -> dict[str, FinishReason]:
        """Advance each constrained request by its run of tokens (its accepted drafts, then its
        sample). Returns the requests this ends: "stop" when its grammar terminated, and its run is
        cut after the stop token that ended it; "error" when a token broke it (never, under the mask)."""
        pending = [(r, run) for r, run in zip(req_ids, runs, strict=True) if r in self._matchers]
        ended: dict[str, FinishReason] = {}
        if not pending:
            return ended
        import xgrammar as xgr

        # Position by position, each request's matcher takes the next token of its run in one batch.
        for position in range(max(len(run) for _, run in pending)):
            live = [(r, run) for r, run in pending if position < len(run) and r not in ended]
            if not live:
                break
            matchers = [self._matchers[r] for r, _ in live]
            tokens = [run[position] for _, run in live]
            accepted = xgr.BatchGrammarMatcher.batch_accept_token(matchers, tokens)
            for (req_id, run), matcher, ok in zip(live, matchers, accepted, strict=True):
                if not ok:
                    logger.error("request %s: sampled token %d breaks its grammar", req_id, run[position])
                    ended[req_id] = "error"
                elif matcher.is_terminated():
                    ended[req_id] = "stop"
                else:
                    continue
                del run[position + 1 :]
        return ended


def _bitmask_row(allowed: list[bool], vocab_size: int) -> torch.Tensor:
    """xgrammar's bitmask layout of `allowed` (per token id; ids past it are not allowed): bit j of
    int32 word i is token 32 * i + j."""
    bits = np.zeros(-(-vocab_size // 32) * 32, dtype=bool)
    bits[: len(allowed)] = allowed[:vocab_size]
    return torch.from_numpy(np.packbits(bits, bitorder="little").view("<i4").copy())
