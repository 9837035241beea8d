"""The demo's request script: varied, valid and reproducible."""

from rawgraph.demo import script


def test_demo_script_is_varied_and_valid():
    reqs = script(512, 12)
    assert len({len(r.prompt) for r in reqs}) >= 3 and len({r.max_new_tokens for r in reqs}) >= 3
    assert any(r.sampling.temperature > 0 for r in reqs)
    assert any(r.arrival > 0 for r in reqs) and all(max(r.prompt) < 512 for r in reqs)
    assert [r.output for r in script(512, 12)] == [r.output for r in reqs]
