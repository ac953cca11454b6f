"""The model-runner core: the model, its paged KV cache, attention, sampling and speculative decoding,
one step at a time (`ModelRunner.execute_model`). No Redis: the service shell (service/) feeds it."""
