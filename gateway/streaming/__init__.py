"""Server-sent events: the event encoding and the stream of a generation as SSE."""
