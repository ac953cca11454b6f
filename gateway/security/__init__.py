"""Who may call, how much and how fast: API keys, rate limits, the queue bound, body and connection caps."""
