"""Shared prefixes: a pool of prefixes (system prompts, documents) that requests begin with.

A prefixed request's content is (("pfx:<k>", prefix_len_k), ("req:<id>", suffix_len)) and its
prompt_len is prefix + suffix. Equal keys mean equal tokens, so requests picking the same k share
their first prefix_len_k tokens and nothing after; the prefix cache sees exactly that.
"""

from __future__ import annotations

import numpy as np

from simcore.request import Segment
from workloads.lengths import sample_lengths
from workloads.spec import PrefixSpec, ZipfChoice
from workloads.streams import stream

NO_PREFIX = -1


def choice_probabilities(spec: PrefixSpec) -> np.ndarray:
    """Probability of picking each prefix: equal, or Zipf-like 1/(k+1)^s over the finite pool."""
    if isinstance(spec.choice, ZipfChoice):
        # A huge exponent overflows k^s to inf for k >= 2: weight 0, the limit (all on the first).
        with np.errstate(over="ignore"):
            weights = 1.0 / np.arange(1, spec.num_prefixes + 1, dtype=np.float64) ** spec.choice.s
        return weights / weights.sum()
    return np.full(spec.num_prefixes, 1.0 / spec.num_prefixes)


def draw_prefixes(spec: PrefixSpec, num_users: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(prefix index per user or NO_PREFIX, token count of each prefix in the pool).

    A "user" is a request, or a whole session when sessions are used.
    """
    prefix_lens = sample_lengths(spec.prefix_len, spec.num_prefixes, stream(seed, "prefix_len"))
    picks = stream(seed, "prefix_choice").choice(spec.num_prefixes, num_users, p=choice_probabilities(spec))
    uses = stream(seed, "prefix_share").random(num_users) < spec.share
    return np.where(uses, picks, NO_PREFIX).astype(np.int64), prefix_lens


def prefix_segment(index: int, prefix_lens: np.ndarray) -> tuple[Segment, ...]:
    """The leading segment for one prefix index, or nothing for NO_PREFIX."""
    if index == NO_PREFIX:
        return ()
    return ((f"pfx:{index}", int(prefix_lens[index])),)


def prefixed_requests(
    indices: np.ndarray, prefix_lens: np.ndarray, suffix_lens: np.ndarray
) -> tuple[np.ndarray, list[tuple[Segment, ...]]]:
    """(prompt lengths, segments) for requests 0..n-1, each prefix + its own "req:<id>" suffix."""
    has_prefix = indices != NO_PREFIX
    prompt_lens = suffix_lens + np.where(has_prefix, prefix_lens[np.maximum(indices, 0)], 0)
    heads = [(f"pfx:{k}", int(n)) for k, n in enumerate(prefix_lens.tolist())]
    segments = [
        (heads[k], (f"req:{i}", n)) if k != NO_PREFIX else ((f"req:{i}", n),)
        for i, (k, n) in enumerate(zip(indices.tolist(), suffix_lens.tolist(), strict=True))
    ]
    return prompt_lens, segments
