"""Per-step counts of a run of steps, derived in bulk when its step records are sealed.

A run's step records need, for every step, the decoders in it, and after it the requests
running, the blocks in use and the resident tokens. All follow from a handful of numbers known
before the run (each decoder's next new-block step, who finishes at which step, the prompt's
chunk), so a run keeps those (`RunCounts`) and the step log expands a whole chunk of runs at
once with numpy (`expand_run_counts`) instead of each run building lists step by step.

The last step's counts are read from the state after the run (`last`), as for a single step.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np


@dataclass(slots=True)
class RunCounts:
    num_steps: int
    block_size: int
    running: int  # requests running before the run
    blocks: int  # blocks in use before the run
    resident: int  # resident tokens before the run
    firsts: list[int]  # each decoder's next new-block step (1-based), in the first step's order
    # Decoders that finish before the last step: (finish step, batch index, context before
    # the run, blocks held before the run), in finish order. A decoder is in the steps up to
    # its finish step and releases every block it holds at its end.
    departures: list[tuple[int, int, int, int]]
    chunk: int = 0  # positions of a prompt processed each step (0: none)
    prompt_first: int = 0  # the prompt's next new-block position (1-based), when chunk > 0
    has_prompt: bool = False  # a prompt is in every step (num_seqs counts it)
    completes: bool = False  # the last step completes the prompt (it selects a token)
    # Prompts the last step admits with their first chunks (one more sequence each), and of
    # those, the ones whose chunk is the whole prompt (their first outputs: one more selecting).
    num_newcomers: int = 0
    num_newcomers_selecting: int = 0
    # Where the chunk is the budget left beside the decoders: the most it may grow to as they
    # leave (a step with d decoders takes min(chunk_cap, chunk + len(firsts) - d)); 0: fixed.
    chunk_cap: int = 0
    # The last step's prompt positions besides its chunk's: the chunk that completes the prompt
    # (`completes`: it stands for the chunk) and the newcomers' first chunks.
    tail: int = 0
    newcomer_positions: int = 0
    # Running requests, blocks in use and resident tokens after the last step.
    last: tuple[int, int, int] = (0, 0, 0)


def expand_run_counts(runs: list[RunCounts]) -> dict[str, np.ndarray]:
    """Every step of `runs` (of one block size), in order: decoders, sequences, selecting
    sequences, prompt positions, and after the step running requests, blocks in use and
    resident tokens, by step record column (int64 arrays, one row a step)."""
    bs = runs[0].block_size
    # Each field across the runs, each run's fields as a row (comprehensions: slot reads in one
    # are about twice as fast as through an attrgetter).
    num_runs = len(runs)
    rows = [(run.num_steps, run.chunk, run.prompt_first, run.blocks, run.running, run.resident, run.completes,
             run.has_prompt, run.num_newcomers, run.num_newcomers_selecting, run.chunk_cap, run.tail,
             run.newcomer_positions) for run in runs]
    (lengths, chunk, prompt_first, blocks_before, running_before, resident_before, completes, has_prompt, newcomers,
     newcomers_selecting, chunk_cap, tail, newcomer_positions) = np.fromiter(chain.from_iterable(rows), np.int64,
                                     count=len(rows[0]) * num_runs).reshape(num_runs, len(rows[0])).T
    firsts_by_run = [run.firsts for run in runs]
    num_decoders = np.fromiter(map(len, firsts_by_run), np.int64, count=num_runs)
    last_running, last_blocks, last_resident = np.fromiter(
        chain.from_iterable([run.last for run in runs]), np.int64, count=3 * num_runs).reshape(num_runs, 3).T
    total = int(lengths.sum())
    starts = np.cumsum(lengths) - lengths
    last_rows = starts + lengths - 1

    def per_row(values: np.ndarray) -> np.ndarray:
        return np.repeat(values, lengths)

    # Row r of a run is its step r + 1 (1-based): decoders and sequences are those in it, running
    # requests, blocks and resident tokens those after it. Block growth: decoder i takes a block
    # at steps first_i, first_i + bs, ... up to its limit (the run's next-to-last step, or its
    # own finish step).
    firsts = np.fromiter(chain.from_iterable(firsts_by_run), np.int64, count=int(num_decoders.sum()))
    limits = np.repeat(lengths - 1, num_decoders)
    decoder_base = np.cumsum(num_decoders) - num_decoders
    departures = [(index, *departure) for index, run in enumerate(runs) for departure in run.departures]
    if departures:
        leaving = np.array(departures, dtype=np.int64)  # run, finish step, batch index, context, held
        run_of, finish, context, held = leaving[:, 0], leaving[:, 1], leaving[:, 3], leaving[:, 4]
        limits[decoder_base[run_of] + leaving[:, 2]] = finish
    grows = np.maximum((limits - firsts) // bs + 1, 0)
    # A block taken at step p shows from row p - 1.
    growth_rows = np.repeat(firsts + np.repeat(starts - 1, num_decoders), grows)
    num_growths = len(growth_rows)
    if num_growths:
        growth_rows += bs * (np.arange(num_growths, dtype=np.int64) - np.repeat(np.cumsum(grows) - grows, grows))
    block_delta = np.bincount(growth_rows, minlength=total).astype(np.int64)
    running_delta = np.zeros(total, dtype=np.int64)
    token_delta = np.zeros(total, dtype=np.int64)
    decoder_delta = np.zeros(total, dtype=np.int64)
    if departures:
        rows = starts[run_of] + finish - 1
        taken = grows[decoder_base[run_of] + leaving[:, 2]]
        np.subtract.at(block_delta, rows, held + taken)  # all it holds goes back after its last step
        np.subtract.at(running_delta, rows, 1)
        np.subtract.at(token_delta, rows, context + finish)
        np.subtract.at(decoder_delta, rows + 1, 1)  # gone from the step after its finish step
    decoders = per_row(num_decoders) + _cumsum_within(decoder_delta, starts, lengths)
    # Tokens stored by each step: its decodes and the prompt's chunk. (A run's last row, the
    # one with a tail, takes its counts from `last`.)
    row_chunk = per_row(chunk)
    if chunk_cap.any():  # chunks that grow as decoders leave
        cap = per_row(chunk_cap)
        row_chunk = np.where(cap > 0, np.minimum(cap, row_chunk + per_row(num_decoders) - decoders), row_chunk)
        stored = _cumsum_within(row_chunk, starts, lengths)  # prompt positions
    else:
        stored = (np.arange(total, dtype=np.int64) - per_row(starts) + 1) * row_chunk
    tokens = _cumsum_within(decoders + row_chunk, starts, lengths)
    # The prompt positions each step processes: its chunk (a fresh array, not needed above from
    # here), but for the last step's tail and newcomers.
    prompt_tokens = row_chunk
    prompt_tokens[last_rows] = np.where(completes > 0, tail, prompt_tokens[last_rows]) + newcomer_positions
    first = per_row(prompt_first)
    prompt_blocks = np.where((stored > 0) & (stored >= first), (stored - first) // bs + 1, 0)
    blocks = per_row(blocks_before) + _cumsum_within(block_delta, starts, lengths) + prompt_blocks
    running = per_row(running_before) + _cumsum_within(running_delta, starts, lengths)
    resident = per_row(resident_before) + tokens + _cumsum_within(token_delta, starts, lengths)
    running[last_rows], blocks[last_rows], resident[last_rows] = last_running, last_blocks, last_resident
    selected = decoders.copy()
    selected[last_rows] += completes + newcomers_selecting
    seqs = decoders + per_row(has_prompt)
    seqs[last_rows] += newcomers
    return {"num_decode_tokens": decoders, "num_seqs": seqs, "num_selected": selected,
            "num_prefill_tokens": prompt_tokens, "num_running": running, "kv_blocks_used": blocks,
            "resident_tokens": resident}


def _cumsum_within(delta: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Running sums of `delta` restarted at each run's first row."""
    total = np.cumsum(delta)
    before = np.zeros(len(starts), dtype=np.int64)
    before[1:] = total[starts[1:] - 1]
    return total - np.repeat(before, lengths)
