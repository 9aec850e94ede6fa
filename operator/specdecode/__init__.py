"""specdecode-operator: speculative decoding for vLLM on Kubernetes, kept honest by its metrics."""

__version__ = "0.1.0"
