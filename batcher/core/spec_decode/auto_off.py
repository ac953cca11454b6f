"""Per worker, whether its decodes draft in a step: speculation turns itself off where it no longer
pays. Not in a step of a worker running `disable_by_batch_size` requests or more (a large batch
already reads the weights for many tokens), and not on a worker whose last WINDOW drafted decodes
were accepted below `disable_by_acceptance_rate` (accepted / drafted tokens). While off, one request
drafts in one step of PROBE_INTERVAL (from then on, every step lets one request draft until one has:
with async scheduling the probe first waits a step for its request's result), and the worker drafts
again once its last PROBES such probes reach the rate: traffic that repeats itself again turns it
back on. It only decides whether drafts are proposed, so no output changes.
"""

from __future__ import annotations

from collections import deque

from common.spec_decode.speculative_config import SpeculativeConfig

WINDOW = 32  # drafted decodes judged while on: 2 steps at 16 in flight, 32 at one
PROBE_INTERVAL = 16  # while off, one step of this many drafts for one request: ~1.5% more tokens at 16
PROBES = 4  # while off, the latest probes (up to this many) are judged after each one


class AutoOff:
    def __init__(self, config: SpeculativeConfig) -> None:
        self.max_batch_size = config.disable_by_batch_size
        self.min_rate = config.disable_by_acceptance_rate
        self.off = False  # turned off by acceptance
        self.num_turned_off = 0
        self._recent: deque[tuple[int, int]] = deque(maxlen=WINDOW)  # (drafted, accepted) per decode
        self._steps_off = 0

    def num_drafting(self, batch_size: int) -> int:
        """How many of the worker's `batch_size` running requests may draft in the step being
        planned; called once per step."""
        if self.off:
            self._steps_off += 1
        return self._allowed(batch_size, self._steps_off)

    def num_drafting_next(self, batch_size: int) -> int:
        """What `num_drafting` will allow in the step after the one being planned (a draft model's
        drafts are made a step ahead); changes nothing."""
        return self._allowed(batch_size, self._steps_off + 1)

    def _allowed(self, batch_size: int, steps_off: int) -> int:
        if self.max_batch_size is not None and batch_size >= self.max_batch_size:
            return 0
        if not self.off:
            return batch_size
        return 1 if steps_off >= PROBE_INTERVAL else 0

    def record(self, num_drafts: int, num_accepted: int) -> None:
        """One decode's `num_drafts` drafts verified, `num_accepted` of them accepted."""
        if self.min_rate is None or num_drafts <= 0:
            return
        self._recent.append((num_drafts, num_accepted))
        if self.off:
            self._steps_off = 0  # a probe was measured: the next one PROBE_INTERVAL steps on
        if len(self._recent) < (self._recent.maxlen or 0) and not self.off:
            return  # judged on a full window only: one unlucky decode does not turn it off
        rate = sum(a for _, a in self._recent) / sum(d for d, _ in self._recent)
        if self.off and rate >= self.min_rate:
            self.off = False
            self._recent = deque(maxlen=WINDOW)
        elif not self.off and rate < self.min_rate:
            self.off = True
            self.num_turned_off += 1
            self._recent = deque(maxlen=PROBES)
            self._steps_off = 0


def make_auto_off(config: SpeculativeConfig | None) -> AutoOff | None:
    """A worker's gate when speculation is on (None: it never drafts)."""
    return None if config is None else AutoOff(config)
