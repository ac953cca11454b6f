"""Function tools: the tools and tool_choice a body gives, past calls in its messages, and the parsers
that read calls back."""
