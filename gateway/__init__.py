"""OpenAI-compatible HTTP front end: validates, tokenizes, queues requests and relays their tokens."""
