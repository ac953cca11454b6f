"""What a tool parser gives back as a choice's text arrives, and the interface every format's parser
has: feed pieces, finish at the end; a whole answer is its text fed at once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(slots=True)
class ToolCallDelta:
    index: int  # the call's position among the choice's calls
    arguments: str  # the next piece of its arguments ("" in the piece that opens the call)
    id: str | None = None  # set in the first piece of a call only, with its name
    name: str | None = None


@dataclass(slots=True)
class ParsedDelta:
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)
    reasoning: str = ""  # the model's thoughts (reasoning/), before the content

    def then(self, later: ParsedDelta) -> ParsedDelta:
        """This delta followed by `later`, as one."""
        return ParsedDelta(
            self.content + later.content, self.tool_calls + later.tool_calls, self.reasoning + later.reasoning
        )


class ToolParser(Protocol):
    # Where a call's text ends, if the format marks it: the Responses API feeds text cut after each
    # one, so that content and calls in one delta keep their order.
    call_end: str | None

    def feed(self, text: str) -> ParsedDelta: ...

    def finish(self) -> ParsedDelta: ...

    @property
    def made_calls(self) -> bool: ...
