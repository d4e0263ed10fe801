"""Observability: Prometheus metrics, JSON logging, request ids."""
