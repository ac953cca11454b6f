"""OpenAI's request and answer schemas, its error bodies and list pages: what every other folder speaks."""
