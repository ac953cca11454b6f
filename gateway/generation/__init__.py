"""Generation requests from admission to answer: tokenize, place in a cell, bound the queue, rate-limit,
submit (`admission.py`), then stream or collect the answer (`flow.py`)."""
