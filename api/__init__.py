"""The deployable API entry point (``uvicorn api.app:app``), the twin of ``worker.py``."""
