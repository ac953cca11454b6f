"""Shared by every service: message schemas, stream names, settings and small helpers."""
