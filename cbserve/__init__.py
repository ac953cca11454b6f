"""`cbserve`: one-command launcher (`cbserve up`) and terminal clients (`chat`, `complete`)."""
