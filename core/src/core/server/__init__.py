"""The OpenAI-compatible HTTP server behind ``core serve`` (FastAPI + uvicorn)."""
