"""The comparison figure: TTFT CDF, TPOT spread and output throughput of each system (PNG, Agg)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def plot_comparison(records: dict[str, dict[str, Any]], path: Path, title: str = "") -> Path:
    """`records`: system name -> run record (see report.run_record)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(records)
    fig, (ax_ttft, ax_tpot, ax_tput) = plt.subplots(1, 3, figsize=(15, 4.5))
    tpots: list[list[float]] = []
    for name in names:
        done = [r for r in records[name]["requests"] if r["success"]]
        ttfts = np.sort(np.asarray([r["ttft_s"] * 1000.0 for r in done]))
        if len(ttfts):
            ax_ttft.step(ttfts, np.arange(1, len(ttfts) + 1) / len(ttfts), where="post", label=name)
        tpots.append([r["tpot_s"] * 1000.0 for r in done if r["output_tokens"] > 1])
    ax_ttft.set(title="TTFT distribution (CDF)", xlabel="TTFT (ms)", ylabel="fraction of requests")
    ax_ttft.grid(alpha=0.3)
    ax_ttft.legend()

    ax_tpot.boxplot([t or [0.0] for t in tpots], showfliers=True)
    ax_tpot.set_xticks(range(1, len(names) + 1), names)
    ax_tpot.set(title="TPOT per request", ylabel="TPOT (ms)")
    ax_tpot.grid(alpha=0.3, axis="y")

    throughput = [records[n]["summary"]["output_throughput"] for n in names]
    bars = ax_tput.bar(names, throughput, color=[f"C{i}" for i in range(len(names))])
    ax_tput.bar_label(bars, fmt="%.1f")
    ax_tput.set(title="Output token throughput", ylabel="tokens/s")
    ax_tput.grid(alpha=0.3, axis="y")

    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
