"""Fast CUDA paths against the portable path. They run only where CUDA is available; the
kernel-level test also runs on the CPU under Triton's interpreter (TRITON_INTERPRET=1)."""

from __future__ import annotations

import importlib.util
import math
import os

import pytest

torch = pytest.importorskip("torch")

from backends.torch.attention import AttentionMetadata, PortableDecode  # noqa: E402
from backends.torch.factory import build_engine  # noqa: E402
from tests.test_torch_support import seq, step, tiny_spec  # noqa: E402

HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
needs_triton_cuda = pytest.mark.skipif(not (HAS_CUDA and HAS_TRITON), reason="needs CUDA and triton")


def _interpreter_numpy_fix() -> None:
    # triton 3.5's interpreter calls int() on 1-element arrays, which numpy >= 2.4 refuses.
    import triton.runtime.interpreter as interp

    original = interp._patch_lang_tensor

    def patched(tensor):
        original(tensor)
        tensor.__index__ = lambda self: int(self.handle.data.reshape(-1)[0])

    interp._patch_lang_tensor = patched


@pytest.mark.skipif(not HAS_TRITON or not (HAS_CUDA or INTERPRET), reason="needs triton on CUDA, or TRITON_INTERPRET=1")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim", "block_size"), [(32, 8, 128, 16), (8, 1, 64, 4), (4, 4, 24, 8)])
def test_triton_paged_decode_matches_portable(dtype, heads, kv_heads, head_dim, block_size):
    if INTERPRET and not HAS_CUDA:
        if dtype == "bfloat16" or head_dim > 64:
            pytest.skip("the interpreter is slow and emulates bf16 poorly; fp32 small shapes suffice")
        _interpreter_numpy_fix()
    from backends.torch.triton_decode import paged_decode

    device = torch.device("cuda" if HAS_CUDA else "cpu")
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)
    num_blocks = 600
    lens = torch.tensor([1, 7, 300, 1000, 2049])
    width = -(-int(lens.max()) // block_size)
    tables = torch.stack([torch.randperm(num_blocks, generator=gen)[:width] for _ in lens])
    k = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)
    v = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)
    q = torch.randn(len(lens), heads, head_dim, generator=gen)
    meta = AttentionMetadata(slot_mapping=torch.zeros(len(lens), dtype=torch.long), num_decode=len(lens),
                             decode_block_tables=tables, decode_seq_lens=lens, decode_max_len=int(lens.max()))
    portable = PortableDecode()
    portable.begin_step(meta)
    scale = 1 / math.sqrt(head_dim)
    ref = portable(q.to(dt).float(), k.to(dt).float(), v.to(dt).float(), meta, scale)
    to = dict(device=device)
    for splits in (1, 4):
        out = paged_decode(q.to(dt).to(**to), k.to(dt).to(**to), v.to(dt).to(**to), tables.to(**to), lens.to(**to),
                           scale, splits)
        tol = 1e-4 if dt == torch.float32 else 2e-2
        torch.testing.assert_close(out.float().cpu(), ref, atol=tol, rtol=tol)


def _engine(attention: str, dtype=torch.bfloat16, host_blocks: int = 0):
    spec = tiny_spec(kv_heads=2, vocab=256)
    return build_engine(spec, device=torch.device("cuda"), dtype=dtype, num_blocks=64, block_size=16,
                        num_host_blocks=host_blocks, attention=attention)


def _mixed_run(engine) -> tuple[dict, dict]:
    engine.keep_logits = "selected"
    logits = {}
    engine.execute(step(seq(1, 40, 0, 40, [3, 9, 1]), seq(2, 70, 0, 70, [10, 11, 12, 13, 14])))
    # chunk of a third request with context, next to decodes of the first two
    engine.execute(step(seq(3, 20, 0, 50, [20, 21, 22, 23]), seq(1, 1, 40, 40, [3, 9, 1]),
                        seq(2, 1, 70, 70, [10, 11, 12, 13, 14]), step_id=1))
    logits.update({k: v.clone() for k, v in engine.last_logits.items()})
    engine.execute(step(seq(3, 30, 20, 50, [20, 21, 22, 23]), seq(1, 1, 41, 40, [3, 9, 1]), step_id=2))
    logits.update({(k, 2): v.clone() for k, v in engine.last_logits.items()})
    return logits, {r: engine.output_token_ids(r) for r in (1, 2, 3)}


@needs_triton_cuda
@pytest.mark.parametrize("attention", ["triton", "flex"])
def test_fast_attention_engine_matches_portable_on_cuda(attention):
    ref_logits, _ = _mixed_run(_engine("portable"))
    got_logits, _ = _mixed_run(_engine(attention))
    for key, ref in ref_logits.items():
        torch.testing.assert_close(got_logits[key], ref, atol=3e-2, rtol=3e-2)


@needs_triton_cuda
def test_cuda_graph_decode_matches_eager():
    from backends.torch.cuda_graphs import DecodeGraphs

    eager, graphed = _engine("triton", torch.float32), _engine("triton", torch.float32)
    graphed.graphs = DecodeGraphs(graphed.model, graphed.pool, max_batch=8, max_context=256)
    graphed.graphs.capture()
    tables = {1: [0, 1, 2, 3], 2: [4, 5, 6], 3: [7, 8, 9]}
    prompts = {1: 30, 2: 5, 3: 17}
    for engine in (eager, graphed):
        engine.execute(step(*(seq(r, p, 0, p, tables[r]) for r, p in prompts.items())))
        for k in range(12):  # decode-only steps of three rows (bucket 4); crossing block boundaries
            engine.execute(step(*(seq(r, 1, p + k, p, tables[r]) for r, p in prompts.items()), step_id=k + 1))
    for rid in prompts:
        assert graphed.output_token_ids(rid) == eager.output_token_ids(rid)
    graphed.keep_logits = None
    assert graphed.graphs.can_run(graphed.prepare(step(seq(1, 1, 42, 30, tables[1]))))


@needs_cuda
def test_swaps_through_pinned_memory_on_cuda():
    engine = _engine("portable", torch.float32, host_blocks=4)
    engine.pool.kv[:, :, 2].normal_()
    before = engine.pool.kv[:, :, 2].clone()
    engine.execute(step(blocks_to_swap_out=((2, 1),)))
    engine.pool.kv[:, :, 2].zero_()
    engine.execute(step(blocks_to_swap_in=((1, 5),)))
    torch.testing.assert_close(engine.pool.kv[:, :, 5], before, atol=0, rtol=0)


@needs_cuda
def test_cost_model_reports_gpu_time_on_cuda():
    from backends.base import CostContext
    from backends.registry import build_cost_model

    ctx = CostContext(model=tiny_spec(), hardware_name="cuda", block_size=16, num_blocks=32)
    cm = build_cost_model("torch", {"device": "cuda"}, ctx)
    wall = cm.step_time(step(seq(1, 33, 0, 33, [0, 1, 2])))
    assert 0 < cm.last_step_extras["gpu_time_s"] <= wall
