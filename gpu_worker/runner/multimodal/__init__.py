"""Images in, text out: the vision tower, the encoder cache and the step's input embeddings."""
