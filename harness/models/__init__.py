"""Tiny random models saved like hub models: a Llama with a real BPE tokenizer and chat templates in the
families' formats (templates/), and the families whose attention differs."""
