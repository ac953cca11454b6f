"""ChatML, the chat format of the models this project makes (the demo model, the test and benchmark
models): its special tokens and chat template, spelled once. Served models bring their own template.

The template is Qwen2.5's tool-calling ChatML: tools are listed in the system turn inside `<tools>`,
an assistant's calls are `<tool_call>` JSON blocks (the Hermes format, read back by
`tools/parsers/hermes.py`) and tool results are `<tool_response>` blocks in a user turn. Without
tools it renders exactly the plain ChatML these models were trained on.
"""

from __future__ import annotations

from pathlib import Path

EOS = "<|endoftext|>"  # also the bos and pad token
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [EOS, IM_START, IM_END]

CHAT_TEMPLATE = (Path(__file__).parent / "chatml_template.jinja").read_text()
