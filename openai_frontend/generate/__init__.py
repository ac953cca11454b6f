"""An OpenAI body to a queued request: checks, prompt, sampling, and the record stored as the request's
meta."""
