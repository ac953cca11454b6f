"""llama.cpp's convert_hf_to_gguf.py, run so that it takes the benchmark models' own BPE tokenizer.

    python -m benchmarks.baselines.llama_convert .llama/src/convert_hf_to_gguf.py MODEL_DIR \
        --outtype f32 --outfile F

benchmarks/baselines/gguf.py runs this in a child process with the llama.cpp tree's `gguf-py` and its own
directory on PYTHONPATH, with two of the script's steps adjusted:
- a Llama without `tokenizer.model` has no SentencePiece tokenizer: the script finds that out only
  after importing `sentencepiece` (not installed here, and not needed), so the check comes first;
- an unknown BPE pre-tokenizer is GPT-2's. The script names a BPE tokenizer's pre-tokenizer by
  hashing how it splits a test string, against a table of hub models; the benchmark models train
  their own byte-level BPE (benchmarks/workloads/chatml_tokenizer.py: GPT-2's ByteLevel pre-tokenizer and
  regex), whose hash no table can know. For those it writes `gpt-2`, which is the pre-tokenizer they
  use; a tokenizer the table knows keeps its own name. (llama-server is sent token ids: the
  tokenizer only turns its output ids into text.)
"""

from __future__ import annotations

import importlib
import logging
import runpy
import sys
from typing import Any

FALLBACK_PRE = "gpt-2"


def adjust_converter() -> None:
    base = importlib.import_module("conversion.base")
    known = base.TextModel.get_vocab_base_pre
    sentencepiece_vocab = base.TextModel._create_vocab_sentencepiece

    def create_vocab_sentencepiece(self: Any) -> Any:
        path = self.dir_model / "tokenizer.model"
        if not path.is_file():
            raise FileNotFoundError(f"File not found: {path}")  # what the script does, sentencepiece or not
        return sentencepiece_vocab(self)

    def vocab_base_pre(self: Any, tokenizer: Any) -> str:
        try:
            return str(known(self, tokenizer))
        except NotImplementedError:
            logging.getLogger(__name__).warning("unknown BPE pre-tokenizer: written as %r", FALLBACK_PRE)
            return FALLBACK_PRE

    base.TextModel.get_vocab_base_pre = vocab_base_pre
    base.TextModel._create_vocab_sentencepiece = create_vocab_sentencepiece


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python -m benchmarks.baselines.llama_convert CONVERT_SCRIPT ARGS...")
    adjust_converter()
    sys.argv = list(argv)
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
