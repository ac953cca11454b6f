"""Reasoning formats: how a model's thoughts are told apart from its answer, chosen from the chat
template (or GATEWAY_REASONING_PARSER). `think`: Qwen3, QwQ, DeepSeek-R1 and the families that copy
them write their thoughts between `<think>` and `</think>`; R1's templates open `<think>` in the
prompt, so the output starts inside the thoughts. `harmony`: gpt-oss thinks in its `analysis`
channel and answers in `final` (reasoning/harmony.py)."""

from __future__ import annotations

THINK = "think"
HARMONY = "harmony"
REASONING_PARSERS = (THINK, HARMONY)
# vLLM's --reasoning-parser names for these formats, accepted as they are.
VLLM_NAMES = {
    "deepseek_r1": THINK,
    "deepseek_v3": THINK,
    "qwen3": THINK,
    "glm45": THINK,
    "openai_gptoss": HARMONY,
    "gpt_oss": HARMONY,
}
OPEN, CLOSE = "<think>", "</think>"
HARMONY_SIGNS = ("<|channel|>", "<|message|>")  # what a harmony template writes


def reasoning_for_template(template: str | None) -> str | None:
    """The reasoning format a chat template teaches its model, or None when it has none."""
    if template is None:
        return None
    if all(sign in template for sign in HARMONY_SIGNS) and "analysis" in template:
        return HARMONY
    if OPEN in template or CLOSE in template:  # R1's may write only the `<think>` that opens the reply
        return THINK
    return None


def chosen(setting: str, template: str | None) -> str | None:
    """The format GATEWAY_REASONING_PARSER names: auto reads it from the template, none turns the
    split off."""
    if setting == "auto":
        return reasoning_for_template(template)
    return None if setting == "none" else setting


def prompt_state(prompt_tail: str) -> str:
    """Where the rendered prompt leaves the thoughts: `open` (an R1-style template wrote `<think>`:
    the output starts inside them), `closed` (the template wrote them empty, as Qwen3's does with
    enable_thinking false: the output is all answer) or `none` (the model may think or not)."""
    tail = prompt_tail.rstrip()
    if tail.endswith(CLOSE):
        return "closed"
    opened, closed = tail.rfind(OPEN), tail.rfind(CLOSE)
    return "open" if opened >= 0 and opened > closed else "none"
