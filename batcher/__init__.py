"""The scheduler service: owns all scheduling state and drives the workers one step at a time."""
