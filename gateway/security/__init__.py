"""Who may call and how much they may send: API keys, per-key quotas, body and connection caps."""
