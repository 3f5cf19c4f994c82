"""ShareGPT conversations (JSON list of {id, conversations: [{from, value}]}) replayed as sessions.

Every reply of the model is one turn: its prompt is everything said before it in that
conversation, its output is the reply. So turn k's prompt = turns < k (prompts and replies) + the
new user message(s); content keys "sg:<conversation>:<message>" make the shared history visible
to the prefix cache. Conversations become sessions "s<index in file>".

Token counts come from a local Hugging Face tokenizer when `tokenizer` is given and transformers
is installed (no special tokens, no chat template), else from the estimate
ceil(characters / chars_per_token) (4 by default, a common rule of thumb for English with
Llama/GPT tokenizers). A message of zero tokens adds nothing; a reply of zero tokens is no turn.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from simcore.errors import ConfigError, short_repr
from simcore.request import Segment
from workloads.sessions import session_table
from workloads.traces.common import SURROGATE_ESCAPE, holds_lone_surrogate, json_problem, shown

USER_ROLES = ("human", "user")
MODEL_ROLES = ("gpt", "assistant", "chatgpt", "bard", "model")
CONTEXT_ROLES = ("system",)


@dataclass(frozen=True)
class Conversation:
    index: int  # position in the file, so keys and session ids do not depend on sampling
    roles: tuple[str, ...]  # "user", "model" or "context" per message
    texts: tuple[str, ...]


def load_conversations(path: Path) -> list[Conversation]:
    """Every conversation of a ShareGPT file, with roles checked."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        raise ConfigError(f"cannot open trace ({exc.strerror})", source=str(path)) from None
    try:
        # A byte-order mark, as some Windows tools write, may start the file.
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte {exc.start})", source=str(path), expected="a UTF-8 JSON file") from None
    try:
        data = json.loads(text)
    except (RecursionError, ValueError) as exc:
        line = f"line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else None
        raise ConfigError(json_problem(exc), source=str(path), where=line) from None
    if not isinstance(data, list):
        raise ConfigError("expected a JSON list of conversations", source=str(path), found=type(data).__name__)
    # Only where the file escapes a surrogate can a text hold a lone one.
    check_unicode = SURROGATE_ESCAPE.search(raw) is not None
    return [_conversation(item, i, path, check_unicode) for i, item in enumerate(data)]


def _conversation(item: object, index: int, path: Path, check_unicode: bool) -> Conversation:
    label = f"conversation {index + 1}"
    if not isinstance(item, dict) or not isinstance(item.get("conversations"), list):
        raise ConfigError("expected an object with a 'conversations' list", source=str(path), where=label)
    if "id" in item:
        label += f" (id {short_repr(shown(item['id']))})"  # (bounded: an id may be a 400-digit number)
    roles, texts = [], []
    for j, message in enumerate(item["conversations"]):
        place = f"{label}, message {j + 1}"
        if not isinstance(message, dict):
            raise ConfigError("expected an object {from, value}", source=str(path), where=place)
        role = message.get("from")
        if role in USER_ROLES:
            roles.append("user")
        elif role in MODEL_ROLES:
            roles.append("model")
        elif role in CONTEXT_ROLES:
            roles.append("context")
        else:
            known = [*USER_ROLES, *MODEL_ROLES, *CONTEXT_ROLES]
            raise ConfigError(
                "unknown speaker", source=str(path), where=f"{place}, field 'from'",
                expected=f"one of {known}", found=shown(role), choices=known,
            )
        text = message.get("value")
        if not isinstance(text, str):
            raise ConfigError(
                "message text must be a string", source=str(path), where=f"{place}, field 'value'",
                found=type(text).__name__,
            )
        if check_unicode and holds_lone_surrogate(text):
            # A tokenizer, or any file the run writes, would fail on it.
            raise ConfigError("text with a lone UTF-16 surrogate (\\ud800-\\udfff), not Unicode",
                              source=str(path), where=f"{place}, field 'value'")
        texts.append(text)
    return Conversation(index, tuple(roles), tuple(texts))


def count_tokens(
    texts: list[str], *, tokenizer: Path | None, chars_per_token: float, source: str | None = None
) -> tuple[list[int], list[str]]:
    """Token count per text, and notes on how they were counted."""
    if tokenizer is not None:
        # Before importing transformers (seconds): a mistyped folder is reported either way.
        if not tokenizer.exists():
            raise ConfigError("tokenizer folder not found", source=source, where="workload.trace.tokenizer",
                              found=str(tokenizer))
        try:
            from transformers import AutoTokenizer
        except ImportError:
            note = "transformers is not installed; token counts are estimated as ceil(chars / chars_per_token)"
            return _estimate(texts, chars_per_token, source), [note]
        try:
            tok = AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True)
        except Exception as exc:  # transformers raises many types for a folder it cannot load
            raise ConfigError(f"cannot load tokenizer ({exc})", source=source, where="workload.trace.tokenizer",
                              found=str(tokenizer)) from None
        if not texts:
            return [], []
        encoded = tok(texts, add_special_tokens=False)["input_ids"]
        return [len(ids) for ids in encoded], []
    return _estimate(texts, chars_per_token, source), []


def _estimate(texts: list[str], chars_per_token: float, source: str | None) -> list[int]:
    from workloads.spec import MAX_TOKENS

    longest = max((len(t) for t in texts), default=0)
    # A tiny chars_per_token makes counts past any prompt (or the float range, 1e-320: inf).
    if longest / chars_per_token > MAX_TOKENS:
        raise ConfigError(
            f"estimates a message of {longest} characters at {longest / chars_per_token:.3g} tokens, more than "
            f"{MAX_TOKENS}", source=source, where="workload.trace.chars_per_token",
            expected=f"at least {longest / MAX_TOKENS:.3g} characters per token", found=chars_per_token,
        )
    return [math.ceil(len(t) / chars_per_token) for t in texts]


def sharegpt_table(
    conversations: list[Conversation],
    token_lens: list[list[int]],
    *,
    starts: np.ndarray,
    think_s: np.ndarray,
    max_tokens: int | None,
) -> tuple[pd.DataFrame, int]:
    """Turns of the conversations (one start time each; think times per turn, flat) and the
    number of conversations that had no turn (no reply after some prompt) and were left out."""
    turn_counts, new_segments, output_lens, output_keys, session_ids, kept_starts = [], [], [], [], [], []
    num_empty = 0
    for conv, lens, start in zip(conversations, token_lens, starts.tolist(), strict=True):
        turns = _turns(conv, lens)
        if not turns:
            num_empty += 1
            continue
        for new, out_key, out_len in turns:
            new_segments.append(new)
            output_keys.append(out_key)
            output_lens.append(out_len)
        turn_counts.append(len(turns))
        session_ids.append(f"s{conv.index}")
        kept_starts.append(start)
    num_turns = len(output_lens)
    table = session_table(
        starts=np.asarray(kept_starts, dtype=np.float64),
        turn_counts=np.asarray(turn_counts, dtype=np.int64),
        think_s=np.asarray(think_s[:num_turns], dtype=np.float64),
        new_segments=new_segments,
        output_lens=np.asarray(output_lens, dtype=np.int64),
        output_keys=output_keys,
        session_ids=session_ids,
        heads=[()] * len(turn_counts),
        max_tokens=max_tokens,
    )
    return table, num_empty


def _turns(conv: Conversation, lens: list[int]) -> list[tuple[tuple[Segment, ...], str, int]]:
    """(content added since the last reply, reply key, reply length) for each reply with a prompt."""
    turns = []
    pending: list[Segment] = []
    has_prompt = False
    for j, (role, n) in enumerate(zip(conv.roles, lens, strict=True)):
        if n == 0:
            continue
        key = f"sg:{conv.index}:{j}"
        if role == "model" and has_prompt:
            turns.append((tuple(pending), key, n))
            pending = []
        else:
            # A reply with nothing before it, a system prompt, a user message: all are context.
            pending.append((key, n))
            has_prompt = True
    return turns
