"""An assistant turn's thoughts in a chat history, as chat templates read them: a thinking model that
called tools sees what it thought before the calls when it reads their results (gpt-oss's template
writes them back as an `analysis` message, interleaved with the calls)."""

from __future__ import annotations

from typing import Any

from openai_frontend.protocol.errors import invalid_request
from openai_frontend.protocol.openai_schemas import ChatMessage


def thought_fields(i: int, message: ChatMessage) -> dict[str, Any]:
    """The message's thoughts for the template; 400 when a role other than assistant carries them."""
    if message.reasoning_content is None:
        return {}
    if message.role != "assistant":
        param = f"messages[{i}].reasoning_content"
        raise invalid_request("only assistant messages carry reasoning_content", param)
    # Qwen3's templates (and vLLM) name them reasoning_content, gpt-oss's thinking.
    return {"reasoning_content": message.reasoning_content, "thinking": message.reasoning_content}
