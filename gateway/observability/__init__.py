"""What the gateway shows about itself and the batcher: /metrics and the dashboard feed."""
