"""The pipeline's own costs: the control plane per step (one cell or several), the capacity a load
needs, and how soon a killed worker's replacement serves."""
