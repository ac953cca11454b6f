"""What a benchmark serves: the random-weight models with their BPE tokenizer, and the seeded request
lists."""
