"""The generation endpoints by kind, for whoever answers a request it did not receive itself (a
fetch or resume by id, a batch line)."""

from __future__ import annotations

from openai_frontend.completions.chat import CHAT
from openai_frontend.completions.completion import COMPLETION
from openai_frontend.completions.endpoint import Endpoint
from openai_frontend.generate.request import Kind

ENDPOINTS: dict[Kind, Endpoint] = {"chat": CHAT, "completion": COMPLETION}
