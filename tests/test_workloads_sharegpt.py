"""ShareGPT conversations replayed as sessions."""

from pathlib import Path

import pytest

from workloads.sessions import session_think_times
from workloads.spec import build_workload, parse_workload

DATA = Path(__file__).parent / "data"
SPEC = {
    "trace": {"path": "sharegpt_sample.json", "format": "sharegpt", "think_time_s": {"kind": "fixed", "value": 5.0}},
    "arrivals": {"kind": "poisson", "rate": 1.0},
}


def load(data=SPEC, seed=0, base_dir=DATA):
    workload = build_workload(parse_workload(data, source="exp.yaml"), seed=seed, base_dir=base_dir)
    return workload.requests, workload.notes


def test_each_reply_is_a_turn_with_the_whole_history_as_prompt():
    requests, notes = load()
    assert notes == ["sharegpt_sample.json: left out 1 conversation(s) without a reply to a prompt"]
    a = [r for r in requests if r.session_id == "s0"]
    assert [r.turn for r in a] == [0, 1]
    # ceil(chars / 4): "What is a KV cache in one sentence?" has 35 characters.
    assert a[0].segments == (("sg:0:0", 9),) and a[0].prompt_len == 9
    assert a[1].segments == (("sg:0:0", 9), ("sg:0:1", a[0].output_len), ("sg:0:2", 3))
    assert a[1].arrival_s == pytest.approx(a[0].arrival_s + 5.0)
    assert a[0].output_key == "sg:0:1" and a[1].parent_id == a[0].request_id and a[1].think_time_s == 5.0
    b = [r for r in requests if r.session_id == "s1"]
    assert b[0].segments == (("sg:1:0", 4), ("sg:1:1", 1)) and b[0].output_len == 2  # system prompt is context
    d = [r for r in requests if r.session_id == "s3"]
    assert len(d) == 1 and d[0].segments[0][0] == "sg:3:0"  # a greeting before the user is context
    assert {r.session_id for r in requests} == {"s0", "s1", "s3"}
    assert list(session_think_times(requests).values()) == pytest.approx([5.0])


def test_sharegpt_is_seeded_and_sampled_by_conversation():
    assert [r.arrival_s for r in load(seed=3)[0]] == [r.arrival_s for r in load(seed=3)[0]]
    assert [r.arrival_s for r in load(seed=3)[0]] != [r.arrival_s for r in load(seed=4)[0]]
    sampled, _ = load({**SPEC, "trace": {**SPEC["trace"], "sample": {"n": 2, "seed": 1}}})
    sessions = {r.session_id for r in sampled}
    assert len(sessions) <= 2
    for sid in sessions:  # whole conversations, never a turn without its history
        assert sorted(r.turn for r in sampled if r.session_id == sid)[0] == 0


def test_local_tokenizer_counts_tokens(tmp_path):
    pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import PreTrainedTokenizerFast

    # A whitespace word-level tokenizer: one token per word or punctuation mark.
    model = tokenizers.models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(tmp_path / "tok")
    spec = {**SPEC, "trace": {**SPEC["trace"], "path": str(DATA / "sharegpt_sample.json"), "tokenizer": "tok"}}
    requests, notes = load(spec, base_dir=tmp_path)
    first = next(r for r in requests if r.session_id == "s0" and r.turn == 0)
    assert first.prompt_len == 9  # "What is a KV cache in one sentence ?"
    assert not any("estimated" in n for n in notes)
