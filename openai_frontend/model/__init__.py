"""The served models as the front end sees them: names, tokenizers, chat templates, and the LoRA
adapters on them."""
