"""OpenAI answer objects from a request's outputs: chat and completion chunks and bodies, logprobs, usage."""
