"""What greedy decoding must produce: transformers' own `generate`, one request at a time."""

from __future__ import annotations

from pathlib import Path


def greedy_generate(
    model_dir: Path, prompts: list[list[int]], max_tokens: int | list[int]
) -> list[list[int]]:
    """Greedy continuation of each prompt with EOS ignored (as `ignore_eos` asks the server);
    `max_tokens` is one length for all prompts or one per prompt."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    lengths = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else max_tokens
    outputs = []
    for prompt, num_tokens in zip(prompts, lengths, strict=True):
        ids = torch.tensor([prompt])
        # eos_token_id=None as a keyword is what turns EOS off (a GenerationConfig would refill it).
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=num_tokens,
            eos_token_id=None,
            pad_token_id=0,
        )
        outputs.append(out[0, len(prompt) :].tolist())
    return outputs
