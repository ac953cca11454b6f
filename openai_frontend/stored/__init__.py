"""Stored chat completions (`store: true`), OpenAI's: kept per API key, listed, updated, deleted."""
