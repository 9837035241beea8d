"""`bench decode --only profile`: each kernel alone and in place, each labelled part of the
step in place, and the read chain's parts, on the tiny preset (random weights)."""

import pytest

from rawgraph.bench.decode import profile
from rawgraph.model.config import preset

pytestmark = pytest.mark.gpu


def test_the_decode_profile_gives_each_kernel_and_part_in_place_and_the_chains_parts():
    rows = profile("tiny", 2, 64)
    by = {r["kernel"]: r for r in rows}
    step = by.pop("(the step's graph)")
    chain = by.pop("read chain (whole)")
    # each labelled part of the step in place, every launch in one part, and the gaps
    mine = {k.removeprefix("part: "): by.pop(k) for k in list(by) if k.startswith("part: ")}
    assert set(mine) == {"embedding", "qkv", "attention", "o_proj", "gate_up", "down_proj",
                         "lm_head", "sample", "(gaps)"}
    assert mine["qkv"]["launches"] >= preset("tiny").layers and mine["(gaps)"]["launches"] == 0
    assert sum(r["launches"] for r in mine.values()) == step["launches"]
    for part, r in mine.items():
        assert isinstance(r["us in place"], float), (part, r["us in place"])
    parts = {k.removeprefix("read chain: "): by.pop(k) for k in list(by) if k.startswith("read")}
    assert set(parts) == {"qkv", "attention", "o_proj", "gate_up", "down_proj", "lm_head"}
    assert parts["lm_head"]["launches"] == 1 and parts["qkv"]["launches"] == preset("tiny").layers
    assert 0 < chain["us in place"] and 0 < step["us in place"]
    assert by, "no kernel rows"
    for r in by.values():  # the step's kernels: timed alone, and what each costs the step
        assert r["us"] > 0 and r["launches"] >= 1
        assert isinstance(r["us in place"], float), r["us in place"]  # no node refused
        assert r["us in place"] < step["us in place"]
    assert sum(r["launches"] for r in by.values()) <= step["launches"]
