"""Sampling a step's logits: penalties and filters, seeded draws, sampled-token and prompt logprobs."""
