"""Speculative decoding: proposals checked by the target model in one step, losslessly.

The engine asks :meth:`SpecDecoder.propose` for drafts before ``Scheduler.schedule`` (which
reserves KV slots for them and schedules each speculating sequence with its last token and
its drafts: k + 1 query tokens in one decode row), samples every row of the run, and keeps
the accepted prefix (:func:`num_accepted`); the sequence's length rolls back over the rest,
whose KV slots the next step overwrites. Sequences with a grammar or a LoRA adapter do not
speculate. Drafts come from n-gram lookup (:func:`propose_ngram`) or a draft model
(:class:`DraftModel`, drawn once the step is scheduled).
"""

from core.spec_decode.config import METHODS, SpeculativeConfig
from core.spec_decode.decoder import SpecDecoder, num_accepted, row_outputs
from core.spec_decode.draft_model import PENDING, DraftModel
from core.spec_decode.ngram import propose_ngram

__all__ = [
    "METHODS",
    "PENDING",
    "DraftModel",
    "SpecDecoder",
    "SpeculativeConfig",
    "num_accepted",
    "propose_ngram",
    "row_outputs",
]
