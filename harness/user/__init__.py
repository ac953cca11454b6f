"""As a user runs it: the docs' code examples, `make run` and its venv, the load tools docs/api.md names,
and a headless browser for the dashboard."""
