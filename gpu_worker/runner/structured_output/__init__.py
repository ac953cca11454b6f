"""Structured outputs: a grammar matcher per constrained request, whose token masks constrain sampling."""
