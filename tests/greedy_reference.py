"""What greedy decoding must produce: transformers' own `generate`, one request at a time."""

from __future__ import annotations

from pathlib import Path


def greedy_generate(model_dir: Path, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Greedy continuation of each prompt with EOS ignored (as `ignore_eos` asks the server)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    outputs = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        # eos_token_id=None as a keyword is what turns EOS off (a GenerationConfig would refill it).
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_tokens,
            eos_token_id=None,
            pad_token_id=0,
        )
        outputs.append(out[0, len(prompt) :].tolist())
    return outputs
