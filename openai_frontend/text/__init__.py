"""Tokens back to text: incremental detokenizing, stop strings, each step's new text."""
