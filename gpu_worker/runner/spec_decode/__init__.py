"""Speculative decoding on the worker: verifying a step's drafts, and the draft model's proposals."""
