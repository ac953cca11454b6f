"""Summary figures of one run, named and defined as in `vllm bench serve`.

- TPOT of a request: (E2E latency - TTFT) / (output tokens - 1), for requests with more than one token.
- ITL: every gap between token-bearing chunks of every request, pooled.
- Goodput: completed requests per second that met every SLO given (`ttft`, `tpot`, `e2el`, in ms);
  a one-token request counts a TPOT of 0, as in vLLM.
- Throughputs divide by the run's wall-clock duration (first send to last response).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from benchmarks.load.client import RequestOutput

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
SLO_METRICS = ("ttft", "tpot", "e2el")

Summary = dict[str, float]


def parse_goodput(specs: Sequence[str] | None) -> dict[str, float]:
    """`["ttft:500", "tpot:50"]` -> `{"ttft": 500.0, "tpot": 50.0}` (milliseconds)."""
    slos: dict[str, float] = {}
    for spec in specs or ():
        name, sep, value = spec.partition(":")
        if not sep or name not in SLO_METRICS:
            raise ValueError(
                f"--goodput takes NAME:MS with NAME one of {', '.join(SLO_METRICS)}; got {spec!r}"
            )
        try:
            slos[name] = float(value)
        except ValueError:
            raise ValueError(f"--goodput {spec!r}: {value!r} is not a number of milliseconds") from None
        if slos[name] < 0:
            raise ValueError(f"--goodput {spec!r}: the SLO must not be negative")
    return slos


def percentile_label(p: float) -> str:
    return f"p{int(p)}" if float(p).is_integer() else f"p{p}"


def request_tpot(output: RequestOutput) -> float:
    """Seconds per output token after the first; 0 for a request with one token."""
    if output.output_tokens <= 1:
        return 0.0
    return (output.latency - output.ttft) / (output.output_tokens - 1)


def _distribution(name: str, seconds: list[float], percentiles: Sequence[float]) -> Summary:
    values = np.asarray(seconds or [0.0], dtype=np.float64) * 1000.0
    figures = {
        f"mean_{name}_ms": float(values.mean()),
        f"median_{name}_ms": float(np.median(values)),
        f"std_{name}_ms": float(values.std()),
    }
    for p in percentiles:
        figures[f"{percentile_label(p)}_{name}_ms"] = float(np.percentile(values, p))
    return figures


def peak_concurrency(outputs: Sequence[RequestOutput]) -> int:
    """Most requests in flight at once (sweep over [send, last token) intervals)."""
    events = sorted(
        [(o.start_time, 1) for o in outputs if o.success]
        + [(o.start_time + o.latency, -1) for o in outputs if o.success]
    )
    current = peak = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak


def summarize(
    outputs: Sequence[RequestOutput],
    duration_s: float,
    percentiles: Sequence[float] = (99.0,),
    slos_ms: dict[str, float] | None = None,
) -> Summary:
    done = [o for o in outputs if o.success]
    ttfts = [o.ttft for o in done]
    tpots = [request_tpot(o) for o in done if o.output_tokens > 1]
    itls = [gap for o in done for gap in o.itl]
    e2els = [o.latency for o in done]
    total_input = sum(o.prompt_len for o in done)
    total_output = sum(o.output_tokens for o in done)
    duration_s = max(duration_s, 1e-9)
    summary: Summary = {
        "completed": len(done),
        "failed": len(outputs) - len(done),
        "duration_s": duration_s,
        "total_input_tokens": total_input,
        # As the server reports them (usage.prompt_tokens_details.cached_tokens); 0 if it does not.
        "cached_input_tokens": sum(o.cached_tokens for o in done),
        "total_output_tokens": total_output,
        "request_throughput": len(done) / duration_s,
        "output_throughput": total_output / duration_s,
        "total_token_throughput": (total_input + total_output) / duration_s,
        "max_concurrent_requests": peak_concurrency(done),
        # With ignore_eos every request should get exactly what it asked for; anything else is a bug.
        "num_output_len_mismatch": sum(1 for o in done if o.output_tokens != o.output_len),
    }
    if slos_ms:
        summary["request_goodput"] = sum(1 for o in done if meets_slos(o, slos_ms)) / duration_s
    for name, seconds in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        summary.update(_distribution(name, seconds, percentiles))
    return summary


def meets_slos(output: RequestOutput, slos_ms: dict[str, float]) -> bool:
    measured = {"ttft": output.ttft, "tpot": request_tpot(output), "e2el": output.latency}
    return all(measured[name] * 1000.0 <= limit for name, limit in slos_ms.items())
