"""Structured outputs: a request's output constrained to a JSON schema, regex, choice or grammar.

The engine calls :class:`StructuredOutputs` three times: ``matcher`` when a request arrives
(compiling its grammar once, cached), ``bitmask_soon`` as a step's forward starts (the allowed
tokens of every constrained row, filled on a worker thread while the forward runs), and each
matcher's ``accept`` with the sampled token. The bitmask
reaches the logits through the platform's ``apply_token_bitmask`` kernel (an SDK hook with a
torch default), so every backend has structured outputs.
"""

from core.structured.manager import StructuredOutputs
from core.structured.params import StructuredOutputsParams

__all__ = ["StructuredOutputs", "StructuredOutputsParams"]
