"""Random-weight benchmark models with a real byte-level BPE tokenizer, saved like any hub model.

python -m benchmarks.workloads.make_model models/gpt2-small-llama --preset gpt2-small-llama
python -m benchmarks.workloads.make_model models/small-llama --preset small-llama
python -m benchmarks.workloads.make_model models/bench-tiny --preset tiny
python -m benchmarks.workloads.make_model models/draft-llama --preset draft-llama

Presets:
- `gpt2-small-llama` (the issue's benchmark model): Llama architecture at GPT-2-small size, hidden
  768, 12 layers, 12 heads (no GQA), MLP 2048 (Llama's 8/3 ratio: the same MLP parameters as GPT-2's
  4 x 768 with two matrices), vocab 32000, context 2048, fp32. About 134M parameters.
- `llama-1b` (the GPU run): TinyLlama-1.1B's shape, hidden 2048, 22 layers, 32 heads with 4 KV
  heads (GQA), MLP 5632, vocab 32000, context 4096, saved in bfloat16. About 1.1B parameters.
- `small-llama` (the small model of the llama.cpp comparison, issue 23): hidden 512, 8 layers, 8
  heads (no GQA), MLP 1024, vocab 8192, context 2048, fp32. About 29.4M parameters (28.0 Mi).
- `draft-llama` (speculative decoding's draft model, issue 28): the benchmark model's tokenizer
  (vocab 32000, the same training), hidden 256, 2 layers, 4 heads, MLP 512. About 17M parameters,
  16M of them the embedding and the output layer. Its random weights do not predict the target's.
- `tiny`: hidden 64, 2 layers, vocab 512, context 512, like the test suite's model, for smoke runs.

The tokenizer is trained (a few seconds) on text every Python install carries: pydoc's topic help
and the standard library's source files, read, never imported. Weights come from a fixed seed, so the
same preset on the same Python and transformers gives the same model. Outputs are gibberish; the
model exists to cost what a real one of its shape costs.
"""

from __future__ import annotations

import argparse
import json
import sysconfig
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.workloads.chatml_tokenizer import (
    config_token_ids,
    fast_tokenizer,
    generation_config,
    train_tokenizer,
)


@dataclass(frozen=True, slots=True)
class Preset:
    # LlamaConfig's fields, under its names (`config_sizes`).
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    corpus_files: int  # standard-library source files read for tokenizer training (0: none)
    dtype: str = "float32"  # the dtype the weights are saved in

    def config_sizes(self) -> dict[str, Any]:
        """The preset's LlamaConfig fields: all but `corpus_files` and `dtype`."""
        sizes = asdict(self)
        del sizes["corpus_files"], sizes["dtype"]
        return sizes


PRESETS: dict[str, Preset] = {
    "gpt2-small-llama": Preset(32000, 768, 2048, 12, 12, 12, 2048, corpus_files=400),
    "llama-1b": Preset(32000, 2048, 5632, 22, 32, 4, 4096, corpus_files=400, dtype="bfloat16"),
    "small-llama": Preset(8192, 512, 1024, 8, 8, 8, 2048, corpus_files=400),
    "draft-llama": Preset(32000, 256, 512, 2, 4, 4, 2048, corpus_files=400),
    "tiny": Preset(512, 64, 128, 2, 4, 2, 512, corpus_files=0),
}


def corpus(num_files: int) -> Iterator[str]:
    """pydoc's topic help (about 0.5 MB of English), then up to `num_files` stdlib sources, sorted."""
    from pydoc_data.topics import topics

    yield from (topics[key] for key in sorted(topics))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.glob("*.py"))[:num_files]:
        yield path.read_text(encoding="utf-8", errors="replace")


def build_model(out_dir: Path, preset_name: str, seed: int = 0, device: str = "cpu") -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    preset = PRESETS[preset_name]
    tok = train_tokenizer(corpus(preset.corpus_files), preset.vocab_size)
    fast = fast_tokenizer(tok, preset.max_position_embeddings)

    torch.manual_seed(seed)
    config = LlamaConfig(
        **preset.config_sizes(), **config_token_ids(tok), tie_word_embeddings=False, dtype=preset.dtype
    )
    # Initialised in fp32 (the seed fixes the weights), on `device` because a 1B-parameter init is
    # minutes on one CPU thread and seconds on a GPU; then cast to the preset's dtype for saving.
    with torch.device(device):
        model = LlamaForCausalLM(config).to(getattr(torch, preset.dtype))
    model.generation_config = generation_config(tok)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.cpu().save_pretrained(out_dir)
    fast.save_pretrained(out_dir)
    num_params = sum(p.numel() for p in model.parameters())
    meta = {
        "preset": preset_name,
        "seed": seed,
        "init_device": device,
        "num_parameters": num_params,
        "tokenizer_vocab": len(fast),
    }
    (out_dir / "benchmark_model.json").write_text(json.dumps(meta, indent=2) + "\n")
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.workloads.make_model", description=__doc__.split("\n")[0]
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="gpt2-small-llama")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="where the weights are initialised (cpu, cuda)")
    args = parser.parse_args(argv)
    print(build_model(args.out_dir, args.preset, args.seed, args.device))


if __name__ == "__main__":
    main()
