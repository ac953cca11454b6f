"""Submitting a request and following its tokens back: reading token streams, deadlines, resume,
collecting choices."""
