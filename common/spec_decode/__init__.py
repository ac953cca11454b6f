"""Speculative decoding's setting, `SPECULATIVE_CONFIG` (`speculative_config.py`), and the counts a
worker reports of its drafts (`spec_decode_stats.py`)."""
