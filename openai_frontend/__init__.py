"""From an OpenAI request to a queued request, and from its tokens back to an OpenAI response.

A library (like `common/`), shared by the gateway's HTTP API and the Celery batch task: it imports
`common` and third-party packages only, never a service.
"""
