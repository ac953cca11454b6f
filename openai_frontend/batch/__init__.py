"""The Batch and Files APIs: uploaded files, batch objects and their stores, and running a batch's lines."""
