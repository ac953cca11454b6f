"""ChatML, the chat format of the models this project makes (the demo model, the test and benchmark
models): its special tokens and chat template, spelled once. Served models bring their own template."""

from __future__ import annotations

EOS = "<|endoftext|>"  # also the bos and pad token
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [EOS, IM_START, IM_END]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    f"{IM_START}{{{{ message['role'] }}}}\n{{{{ message['content'] }}}}{IM_END}\n"
    "{% endfor %}"
    f"{{% if add_generation_prompt %}}{IM_START}assistant\n{{% endif %}}"
)
