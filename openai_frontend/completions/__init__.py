"""/v1/chat/completions and /v1/completions: their answer shapes, chunks, bodies, logprobs and usage."""
