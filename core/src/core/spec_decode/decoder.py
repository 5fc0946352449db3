"""What the engine calls: proposals before a step, the acceptance rule after it, the counters.

Verification reuses the engine's sampler: the target's logits at the k + 1 positions of a
speculating sequence (its last token, then each draft) are sampled row by row, each row with
the sampling state it would have without speculation (the drafts before it counted as
output, for penalties and min_tokens). Draft ``j`` is accepted when row ``j`` drew it; the
first row that drew anything else gives the run's last token, and a run where every draft
was accepted ends with the last row's token.

This is exact for n-gram drafts, whose proposal is a point mass at draft ``x``: the
rejection sampler of Leviathan et al. accepts ``x`` with probability ``p(x)`` and otherwise
draws from the residual ``max(p - q, 0)`` renormalised, which for ``q = δ_x`` is ``p`` with
``x`` removed. Drawing ``y ~ p`` and accepting when ``y = x`` does both at once (``y`` given
``y != x`` is that residual), so every token has the target's distribution (top-k, top-p,
min-p, penalties, logit bias included) and greedy rows give the tokens of a plain run. A
seeded request keeps its distribution, not its tokens: rejected rows consume noise.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence

from core.sequence import Sequence as Seq
from core.spec_decode.config import SpeculativeConfig
from core.spec_decode.draft_model import PENDING, DraftModel
from core.spec_decode.ngram import find_ngram
from core.structured.backends import Matcher

logger = logging.getLogger(__name__)

#: seconds between two acceptance-rate log lines (while speculating)
LOG_INTERVAL_S = 10.0
#: most steps a sequence goes without drafts after runs that accepted none
MAX_BACKOFF_STEPS = 32
#: an n-gram match of this many tokens or more proposes drafts even while its sequence backs off
STRONG_MATCH = 3
#: a match whose continuation starts 1 to this many tokens past the last run's source resumes the copy
#: (1: the model inserted a token; 2: it changed or dropped one)
RESUME_WITHIN = 2
#: drafts a resumed copy proposes after its first miss (at least)
RESUME_DRAFTS = 2
#: the recent verified runs of a sequence that its back-off weighs
RECENT_RUNS = 8
#: a sequence whose recent runs accepted drafts at least this often does not back off after a miss
KEEP_SPECULATING = 0.25


class SpecDecoder:
    """Proposes drafts for decoding sequences and counts how many the target accepts.

    Speculation is skipped where it does not pay: after ``m`` runs in a row with no draft
    accepted, a sequence proposes nothing for ``2 ** m`` steps (at most
    :data:`MAX_BACKOFF_STEPS`), so text that never repeats itself is rarely verified at k + 1
    positions; one accepted draft ends the back-off. A sequence whose last
    :data:`RECENT_RUNS` runs (at least half that many) accepted drafts in a share of
    :data:`KEEP_SPECULATING` or more does not back off after a miss: a verify step with a
    draft or two costs little more than a plain one, and such a sequence wins it back.
    N-gram drafts also adapt to each sequence's acceptance history and to the match: a run
    accepted whole doubles the sequence's draft length (up to ``num_speculative_tokens``), a
    run cut short sets it to the accepted drafts and one more; while the last run accepted a
    draft (or none ran yet), a match of ``n`` tokens proposes at least ``n`` drafts whatever
    the history (a long recurring suffix is text being copied, as vLLM's suffix decoding sizes
    drafts by the match length), not after a miss (repeated structure whose content differs
    would verify k + 1 rows a step for nothing); and a match of :data:`STRONG_MATCH` tokens or
    more proposes even during a back-off. A copy resumes where it left off: of a suffix's
    occurrences the n-gram lookup takes the first at or after the last run's source (where its
    drafts came from, past those accepted), not the latest, so after the model changes a word
    of the text it copies (``mid`` for ``middle``) the drafts continue that text; such a match,
    1 to :data:`RESUME_WITHIN` tokens past the source right after a sequence's first miss,
    proposes :data:`RESUME_DRAFTS` drafts at least.

    :param config: the checked speculative config.
    :param max_model_len: no draft may reach past it.
    :param draft: the draft model, for the ``draft_model`` method.
    """

    def __init__(self, config: SpeculativeConfig, max_model_len: int, draft: DraftModel | None = None) -> None:
        if (config.method == "draft_model") != (draft is not None):
            raise ValueError(f"method {config.method} with draft model {draft!r}: draft_model needs one, ngram none")
        self.config = config
        self.max_model_len = max_model_len
        self.draft = draft
        self.num_drafts = 0  # runs proposed and verified
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.num_accepted_per_pos = [0] * config.num_speculative_tokens
        self._last_log = time.monotonic()
        self._logged = (0, 0)  # (draft tokens, accepted) at the last log line
        self._misses: dict[int, int] = {}  # seq_id -> runs in a row that accepted nothing
        self._waits: dict[int, int] = {}  # seq_id -> steps left without drafts
        self._lengths: dict[int, int] = {}  # seq_id -> its n-gram draft length now (else num_speculative_tokens)
        self._recent: dict[int, list[bool]] = {}  # seq_id -> whether each of its recent runs accepted a draft
        self._starts: dict[int, int] = {}  # seq_id -> where its proposed n-gram drafts came from in its tokens
        self._sources: dict[int, int] = {}  # seq_id -> where its last run's drafts came from, past those accepted

    def propose(self, seqs: Iterable[Seq], matcher: Callable[[Seq], Matcher | None]) -> dict[int, list[int]]:
        """seq_id -> drafts for each of ``seqs`` (decoding sequences) that has some.

        Drafts stop short of ``max_tokens`` and ``max_model_len``: the run they give (the
        accepted drafts and one token more) never outgrows what a plain run could produce.
        With a draft model they are :data:`PENDING` slots, drawn by ``draft.propose`` once scheduled.
        A sequence with a grammar (``matcher(seq)``) speculates when its matcher can roll back
        (not a reasoning gate before the answer); its n-gram drafts stop before the first token
        the grammar refuses.
        """
        c = self.config
        drafts = {}
        seqs = list(seqs)
        if self.draft is not None:
            self.draft.keep(seq.seq_id for seq in seqs)
        # only sequences still decoding keep their state (finished ones leave no entry behind)
        (waits, self._waits), (misses, self._misses) = (self._waits, {}), (self._misses, {})
        (lengths, self._lengths), (recent, self._recent) = (self._lengths, {}), (self._recent, {})
        (sources, self._sources), self._starts = (self._sources, {}), {}
        for seq in seqs:
            kept_state = (
                (misses, self._misses),
                (lengths, self._lengths),
                (recent, self._recent),
                (sources, self._sources),
            )
            for kept, now in kept_state:
                if seq.seq_id in kept:
                    now[seq.seq_id] = kept[seq.seq_id]
            wait = waits.get(seq.seq_id, 0)
            n, start = 0, -1
            if self.draft is None:  # backing off: only a strong match proposes
                shortest = c.prompt_lookup_min if wait == 0 else max(c.prompt_lookup_min, STRONG_MATCH)
                n, start = find_ngram(seq.token_ids, shortest, c.prompt_lookup_max, self._sources.get(seq.seq_id, -1))
            if wait > 0:
                self._waits[seq.seq_id] = wait - 1
                if not n:
                    continue
            grammar = matcher(seq)
            if grammar is not None and not grammar.can_rollback:
                continue
            room = min(seq.params.max_tokens - seq.num_output_tokens - 1, self.max_model_len - seq.num_tokens)
            if self.draft is not None:
                if room > 0:
                    drafts[seq.seq_id] = [PENDING] * min(c.num_speculative_tokens, room)
            elif n and room > 0:
                length = self._lengths.get(seq.seq_id, c.num_speculative_tokens)
                missed = self._misses.get(seq.seq_id, 0)
                source = self._sources.get(seq.seq_id, -1)
                if not missed:  # the last run accepted: the match's length at least
                    length = max(length, n)
                elif missed == 1 and source >= 0 and 0 < start - source <= RESUME_WITHIN:
                    length = max(length, RESUME_DRAFTS)  # the copy resumes past a changed word
                length = min(length, c.num_speculative_tokens, room)
                proposal = seq.token_ids[start : start + length]
                if proposal and grammar is not None:
                    proposal = proposal[: grammar.validate(proposal)]
                if proposal:
                    drafts[seq.seq_id] = proposal
                    self._starts[seq.seq_id] = start
        return drafts

    def record(self, seq_id: int, num_drafts: int, num_accepted: int) -> None:
        """Count one verified run of sequence ``seq_id``: ``num_drafts`` drafts, ``num_accepted`` of them accepted."""
        recent = self._recent.setdefault(seq_id, [])
        recent.append(num_accepted > 0)
        del recent[:-RECENT_RUNS]
        if num_accepted:
            self._misses.pop(seq_id, None)
            self._waits.pop(seq_id, None)
        else:
            misses = self._misses[seq_id] = self._misses.get(seq_id, 0) + 1
            if len(recent) < RECENT_RUNS // 2 or sum(recent) < KEEP_SPECULATING * len(recent):
                self._waits[seq_id] = min(2**misses, MAX_BACKOFF_STEPS)
        if seq_id in self._starts:
            self._sources[seq_id] = self._starts.pop(seq_id) + num_accepted
        if self.draft is None:  # the next n-gram draft length: doubled after a whole run, else what held
            k = self.config.num_speculative_tokens
            length = self._lengths.get(seq_id, k)
            self._lengths[seq_id] = (
                min(k, max(length, 2 * num_drafts)) if num_accepted == num_drafts else num_accepted + 1
            )
        self.num_drafts += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        for pos in range(num_accepted):
            self.num_accepted_per_pos[pos] += 1
        now = time.monotonic()
        if now - self._last_log >= LOG_INTERVAL_S:
            self._log(now)

    def stats(self) -> dict[str, object]:
        """The counters, for metrics (totals since the engine started)."""
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "num_accepted_tokens_per_pos": list(self.num_accepted_per_pos),
        }

    def _log(self, now: float) -> None:
        drafted = self.num_draft_tokens - self._logged[0]
        accepted = self.num_accepted_tokens - self._logged[1]
        logger.info(
            "speculative decoding (%s, k=%d): %d of %d draft tokens accepted (%.1f%%) in the last %.0fs; "
            "since start %.1f%%, %.2f tokens per verified run",
            self.config.method,
            self.config.num_speculative_tokens,
            accepted,
            drafted,
            100.0 * accepted / drafted if drafted else 0.0,
            now - self._last_log,
            100.0 * self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0,
            1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0,
        )
        self._last_log = now
        self._logged = (self.num_draft_tokens, self.num_accepted_tokens)


def num_accepted(sampled: Sequence[int], drafts: Sequence[int]) -> int:
    """Leading drafts that the target drew at their rows (``sampled[j]`` is row ``j``'s token)."""
    n = 0
    while n < len(drafts) and sampled[n] == drafts[n]:
        n += 1
    return n


def row_outputs(output_token_ids: list[int], drafts: Sequence[int]) -> list[list[int]]:
    """The output each of a run's ``len(drafts) + 1`` rows is sampled after (its penalties, min_tokens)."""
    return [output_token_ids, *(output_token_ids + list(drafts[:j]) for j in range(1, len(drafts) + 1))]
