"""Which token sits at each position of each request: prompt tokens, then the engine's own outputs.

The prompt comes from the plan (`prompt_token_ids`) or, when the workload carries none, is
synthesized: a position covered by a keyed segment gets a token derived from (seed, segment key,
offset within the segment), so requests sharing a prefix by key get equal tokens there (and the
KV blocks the prefix cache shares between them hold what either would compute); an uncovered
position gets one from a generator seeded by (seed, request_id). Either way a request's prompt
is the same in every step and every run. Outputs are appended only when a step reaches the last known token; a recompute
after preemption re-reads the stored outputs and never samples them again (seed 21.6).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

import numpy as np

from simcore.errors import ServesimError
from simcore.plan import ScheduledSeq

# Synthetic prompts are cheap to regenerate; keep only the recently used ones.
_PROMPT_CACHE_SIZE = 1024


class TokenStore:
    def __init__(self, vocab_size: int, seed: int) -> None:
        self.vocab_size = vocab_size
        self.seed = seed
        # request id -> prompt length when first seen (later plans may call prompt+outputs the prompt)
        self._prompt_len: dict[int, int] = {}
        self._outputs: dict[int, array] = {}
        self._prompts: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()

    def num_known(self, request_id: int) -> int:
        """Prompt plus outputs selected so far: the positions whose token is known."""
        return self._prompt_len[request_id] + len(self._outputs[request_id])

    def num_outputs(self, request_id: int) -> int:
        return len(self._outputs[request_id])

    def outputs(self, request_id: int) -> list[int]:
        return list(self._outputs.get(request_id, ()))

    def set_outputs(self, request_id: int, prompt_len: int, tokens: list[int]) -> None:
        """Pretend these outputs were already selected (profiling decodes without their prefill)."""
        self._prompt_len[request_id] = prompt_len
        self._outputs[request_id] = array("q", tokens)

    def append(self, request_id: int, token: int) -> None:
        self._outputs[request_id].append(token)

    def forget(self, request_id: int) -> None:
        self._prompt_len.pop(request_id, None)
        self._outputs.pop(request_id, None)

    def token_at(self, seq: ScheduledSeq) -> int:
        """The token at position context_len (a single-query row), without building arrays."""
        rid, pos = seq.request_id, seq.context_len
        outs = self._outputs.get(rid)
        if outs is None or pos >= self._prompt_len[rid] + len(outs) or pos < self._prompt_len[rid]:
            return int(self.input_ids(seq)[0])  # first sight, prompt position, or an error to report
        return outs[pos - self._prompt_len[rid]]

    def input_ids(self, seq: ScheduledSeq) -> np.ndarray:
        """Token ids at positions context_len .. end_len-1 of this request, int64."""
        rid = seq.request_id
        if rid not in self._prompt_len:
            self._prompt_len[rid] = seq.prompt_len
            self._outputs[rid] = array("q")
        prompt_len = self._prompt_len[rid]
        start, end = seq.context_len, seq.end_len
        known = prompt_len + len(self._outputs[rid])
        if end > known:
            raise RuntimeError(
                f"request {rid}: step processes positions {start}..{end - 1} but only {known} tokens are "
                f"known (prompt {prompt_len} + {known - prompt_len} outputs); a position is processed "
                "only after its token was selected"
            )
        pieces = []
        if start < prompt_len:
            pieces.append(self._prompt(seq, prompt_len)[start:min(end, prompt_len)])
        if end > prompt_len:
            outs = self._outputs[rid]
            pieces.append(np.asarray(outs[max(start, prompt_len) - prompt_len:end - prompt_len], dtype=np.int64))
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def _prompt(self, seq: ScheduledSeq, prompt_len: int) -> np.ndarray:
        if seq.prompt_token_ids is not None:
            ids = np.asarray(seq.prompt_token_ids[:prompt_len], dtype=np.int64)
            if ids.size < prompt_len:
                raise RuntimeError(f"request {seq.request_id}: {ids.size} prompt token ids for prompt_len {prompt_len}")
            if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
                raise ServesimError(
                    f"request {seq.request_id}: prompt token id {int(ids.max())} is outside the model's "
                    f"vocabulary of {self.vocab_size}; use a model whose tokenizer produced the ids"
                )
            return ids
        key = (seq.request_id, prompt_len)
        cached = self._prompts.get(key)
        if cached is None:
            cached = synthetic_prompt(self.seed, seq.request_id, prompt_len, seq.segments, self.vocab_size)
            self._prompts[key] = cached
            if len(self._prompts) > _PROMPT_CACHE_SIZE:
                self._prompts.popitem(last=False)
        else:
            self._prompts.move_to_end(key)
        return cached


def synthetic_prompt(seed: int, request_id: int, prompt_len: int, segments, vocab_size: int) -> np.ndarray:
    """Prompt token ids for a request without explicit ids, int64.

    Position p inside segment (key, n) at offset o gets mix(hash(seed, key) + o) % vocab; positions
    past the segments keep the (seed, request_id) generator's draw for p, as without segments.
    """
    out = np.empty(prompt_len, dtype=np.int64)
    covered = 0
    for key, length in segments or ():
        n = min(int(length), prompt_len - covered)
        if n <= 0:
            break
        out[covered:covered + n] = segment_tokens(seed, str(key), n, vocab_size)
        covered += n
    if covered < prompt_len:
        rng = np.random.default_rng([seed % 2**63, request_id % 2**63])
        out[covered:] = rng.integers(0, vocab_size, size=prompt_len, dtype=np.int64)[covered:]
    return out


def segment_tokens(seed: int, key: str, length: int, vocab_size: int) -> np.ndarray:
    """Tokens at offsets 0..length-1 of a keyed segment: stable across processes (no str hash)."""
    digest = hashlib.blake2b(f"{seed}\x00{key}".encode(), digest_size=8).digest()
    base = np.uint64(int.from_bytes(digest, "little"))
    # splitmix64 over base + offset: neighbouring offsets get unrelated tokens.
    z = base + np.arange(length, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(vocab_size)).astype(np.int64)
