"""Prefix identity (seed 21.4): h0 names the compatible configuration, h_i = hash(h_{i-1}, block i).

A block's content is described without materialising tokens where the workload gives keyed
segments: a tuple of (segment key id, start, end) pieces. With explicit token ids the content is
the tuple of ids. Either way equal content means equal tokens, and the chain makes a block's
identity depend on everything before it, so an identical phrase after a different prefix misses.

Hashes use Python's tuple hash over ints only (strings are interned to ints in first-seen order),
which is stable across processes, so runs are reproducible. Hits are verified against the stored
content, so a hash collision can never alias two contexts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from simcore.request import Request

BlockContent = tuple


@dataclass
class Interner:
    """Maps strings to small ints in first-seen order (deterministic given the workload order)."""

    ids: dict[str, int] = field(default_factory=dict)

    def __call__(self, key: str) -> int:
        found = self.ids.get(key)
        if found is None:
            found = self.ids[key] = len(self.ids)
        return found


@dataclass
class PrefixHasher:
    """Computes the hash chain of a request's full blocks."""

    block_size: int
    # Configuration identity folded into h0: model, block size, KV dtype ...
    config_key: tuple = ()
    interner: Interner = field(default_factory=Interner)
    # Injectable for tests that force collisions.
    hash_fn: Callable[[tuple], int] = hash

    def root_identity(self, request: Request) -> tuple:
        """The compatible-configuration identity (model, KV dtype, block size, adapter, salt) as ints."""
        parts = tuple(self.interner(str(p)) for p in self.config_key)
        adapter = self.interner(f"adapter:{request.adapter_id}")
        salt = self.interner(f"salt:{request.cache_salt}")
        return (parts, adapter, salt, self.block_size)

    def root(self, request: Request) -> int:
        """h0: the hash of the root identity."""
        return self.hash_fn(self.root_identity(request))

    def has_content(self, request: Request) -> bool:
        return request.segments is not None or request.prompt_token_ids is not None

    def block_contents(self, request: Request, num_positions: int) -> list[BlockContent]:
        """Content descriptors of the full blocks among the first `num_positions` positions."""
        num_full = num_positions // self.block_size
        if num_full == 0:
            return []
        bs = self.block_size
        if request.prompt_token_ids is not None and request.segments is None:
            ids = request.prompt_token_ids
            num_full = min(num_full, len(ids) // bs)
            return [tuple(ids[i * bs : (i + 1) * bs]) for i in range(num_full)]
        pieces = self._pieces(request)
        contents: list[BlockContent] = []
        seg_index = 0
        seg_start = 0  # absolute position where pieces[seg_index] starts
        for b in range(num_full):
            lo, hi = b * bs, (b + 1) * bs
            desc = []
            while seg_index < len(pieces) and seg_start + pieces[seg_index][1] <= lo:
                seg_start += pieces[seg_index][1]
                seg_index += 1
            if seg_index < len(pieces) and seg_start + pieces[seg_index][1] >= hi:
                # The block lies within one piece (the usual case: pieces are long): one part.
                contents.append(((pieces[seg_index][0], lo - seg_start, hi - seg_start),))
                continue
            i, start = seg_index, seg_start
            while i < len(pieces) and start < hi:
                key, length = pieces[i]
                a = max(lo, start) - start
                z = min(hi, start + length) - start
                desc.append((key, a, z))
                start += length
                i += 1
            if sum(z - a for _, a, z in desc) < bs:
                break  # content unknown past this point
            contents.append(tuple(desc))
        return contents

    def chain(self, request: Request, contents: list[BlockContent]) -> list[int]:
        hashes: list[int] = []
        previous = self.root(request)
        for content in contents:
            previous = self.hash_fn((previous, content))
            hashes.append(previous)
        return hashes

    def _pieces(self, request: Request) -> list[tuple[int, int]]:
        """Segments as (interned key, length), the prompt's then the request's generated tokens."""
        pieces: list[tuple[int, int]] = []
        covered = 0
        for key, length in request.segments or ():
            length = min(length, request.prompt_len - covered)
            if length <= 0:
                break
            pieces.append((self.interner(key), length))
            covered += length
        if covered < request.prompt_len:
            # Uncovered prompt tokens are unique to this request.
            pieces.append((self.interner(f"uniq:{request.request_id}"), request.prompt_len - covered))
        if request.output_key is not None:
            pieces.append((self.interner(request.output_key), request.num_target_outputs))
        return pieces
