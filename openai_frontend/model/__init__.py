"""The served model as the front end sees it: its name, tokenizer and chat template."""
