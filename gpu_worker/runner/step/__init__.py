"""The stages of one step: checks of its diff, the forward, sampling, outputs, test hooks and rollback."""
