"""Speculative decoding in the batcher: which requests draft, and the drafts (model-free)."""
