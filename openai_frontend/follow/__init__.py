"""Submitting a request and following its tokens back: reading token streams, deadlines, resume,
collecting choices, and the one stream-out every streamed answer goes through."""
