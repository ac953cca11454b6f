"""The generation endpoints by kind, for whoever answers a request it did not receive itself (a
fetch or resume by id, a batch line)."""

from __future__ import annotations

from openai_frontend.chat_response import CHAT
from openai_frontend.completion_response import COMPLETION
from openai_frontend.request_meta import Kind
from openai_frontend.response_format import Endpoint

ENDPOINTS: dict[Kind, Endpoint] = {"chat": CHAT, "completion": COMPLETION}
