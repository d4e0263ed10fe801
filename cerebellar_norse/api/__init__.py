"""HTTP API (FastAPI) of the service."""
