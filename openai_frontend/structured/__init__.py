"""What a body asks its output to follow (response_format, structured_outputs), as the worker's constraint."""
