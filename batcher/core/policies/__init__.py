"""Scheduling policies: what fills one worker's step, chosen once from the setting."""
