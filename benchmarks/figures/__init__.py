"""A run's figures: TTFT, TPOT, ITL and goodput as vLLM defines them, the printed tables and JSON, the
medians of repeated rounds, and the comparison plot."""
