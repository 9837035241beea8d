"""The read chain's plan (`bench.ceiling.step_reads`): the floor's bytes, one link per kernel
of the step, in its order; refusals. (Its kernel and timing: tests/cuda/test_stream_read_gpu.py.)"""

from types import SimpleNamespace

import pytest

from rawgraph.bench.ceiling import LAYER_LINKS, launch_plans, link_parts, step_reads
from rawgraph.model.config import preset


def _array(nbytes: int, at: list[int]) -> SimpleNamespace:
    """A stand-in for a CuPy array: its bytes at the next free 256-byte aligned address."""
    a = SimpleNamespace(nbytes=nbytes, data=SimpleNamespace(ptr=at[0]))
    at[0] += -(-nbytes // 256) * 256
    return a


def _model(cfg, tokens: int, at: list[int]):
    shapes = {"qkv": cfg.q_size + 2 * cfg.kv_size, "o_proj": cfg.hidden,
              "gate_up": 2 * cfg.intermediate, "down_proj": cfg.hidden}
    inner = {"qkv": cfg.hidden, "o_proj": cfg.q_size, "gate_up": cfg.hidden,
             "down_proj": cfg.intermediate}
    w = {f"model.layers.{i}.{n}": _array(2 * shapes[n] * inner[n], at)
         for i in range(cfg.layers) for n in shapes}
    w["lm_head"] = _array(2 * cfg.vocab * cfg.hidden, at)
    k = [_array(2 * tokens * cfg.kv_size, at) for _ in range(cfg.layers)]
    v = [_array(2 * tokens * cfg.kv_size, at) for _ in range(cfg.layers)]
    return w, k, v


@pytest.mark.parametrize(("name", "batch", "ctx"), [("llama-1b", 1, 1024),
                                                    ("llama-1b", 32, 4096),
                                                    ("llama-8b", 4, 32768)])
def test_the_chain_moves_the_floors_bytes_one_link_a_kernel_in_step_order(name, batch, ctx):
    cfg = preset(name)
    w, k, v = _model(cfg, batch * ctx, [1 << 20])
    links = step_reads(cfg, w, k, v, batch, ctx)
    assert len(links) == LAYER_LINKS * cfg.layers + 1
    kv = 2 * batch * ctx * cfg.kv_size  # one layer's K
    floor = cfg.decode_bytes() + 2 * cfg.layers * kv
    norms_and_embedding = 2 * (2 * cfg.layers * cfg.hidden + cfg.hidden)
    assert sum(n for link in links for _, n in link) == floor - norms_and_embedding
    first = links[:LAYER_LINKS]
    assert first[0] == ((w["model.layers.0.qkv"].data.ptr, w["model.layers.0.qkv"].nbytes),)
    assert first[1] == ((k[0].data.ptr, kv), (v[0].data.ptr, kv))  # attention: K and V
    assert [link[0][0] for link in first[2:]] == [
        w[f"model.layers.0.{n}"].data.ptr for n in ("o_proj", "gate_up", "down_proj")]
    assert links[-1] == ((w["lm_head"].data.ptr, w["lm_head"].nbytes),)


def test_the_chain_refuses_what_the_cache_cannot_hold_and_bad_ranges():
    cfg = preset("llama-1b")
    w, k, v = _model(cfg, 1024, [1 << 20])
    with pytest.raises(ValueError, match="layer 0 K: 2097152 bytes asked of an array of 1048576"):
        step_reads(cfg, w, k, v, 2, 1024)  # the cache holds 1,024 tokens a layer
    with pytest.raises(ValueError, match="batch 0, ctx 8"):
        step_reads(cfg, w, k, v, 0, 8)
    w["lm_head"].data.ptr += 8
    with pytest.raises(ValueError, match=r"lm_head: .* address % 16 = 8"):
        step_reads(cfg, w, k, v, 1, 1024)


def test_the_launch_plans_are_the_unbroken_chain_the_steps_breaks_and_large_links_plain():
    mib = 1 << 20
    links = [((0, 8 * mib),), ((16, 40 * mib), (32, 40 * mib)), ((48, 300 * mib),),
             ((64, 16),), ((80, 33 * mib),)]
    plans = launch_plans(links, after_attention=[2])
    # the first link is never "plain" (it starts the chain); a link's bytes are all its ranges'
    assert plans == [(), (2,), (1, 2, 4), (1, 2, 3, 4)]  # 256 MiB gives (2,): already there
    assert launch_plans(links[:1], after_attention=[]) == [()]


@pytest.mark.parametrize("name", ["llama-1b", "llama-8b"])
def test_each_link_has_its_step_part(name):
    cfg = preset(name)
    w, k, v = _model(cfg, 1024, [1 << 20])
    links, parts = step_reads(cfg, w, k, v, 1, 1024), link_parts(cfg)
    assert len(parts) == len(links) and parts[-1] == "lm_head"
    for j, (part, link) in enumerate(zip(parts[:-1], links)):
        i = j // LAYER_LINKS  # the layer
        if part == "attention":
            assert link == ((k[i].data.ptr, 2 * 1024 * cfg.kv_size),
                            (v[i].data.ptr, 2 * 1024 * cfg.kv_size))
        else:
            assert link == ((w[f"model.layers.{i}.{part}"].data.ptr,
                             w[f"model.layers.{i}.{part}"].nbytes),)
