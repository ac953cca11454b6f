"""What a benchmark serves: the random-weight models with their BPE tokenizer, the tokenizer read
without transformers, and the seeded request lists."""
