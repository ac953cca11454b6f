"""OpenAI-compatible HTTP API: auth, limits, routes and SSE around the openai_frontend library."""
