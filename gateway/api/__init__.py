"""The HTTP routes: one module per endpoint family, plus the flow the generation routes share."""
