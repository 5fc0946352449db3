"""core: a device-neutral LLM inference and serving engine with pluggable backends."""

__version__ = "0.1.0"
