"""What the gateway tests drive it with: a gateway in a thread, stand-ins for the worker's side of the
protocol, an SSE reader, parser deltas joined as a client joins them, a trip schema."""
