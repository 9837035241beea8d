"""Patch planning without a GPU: which nodes change, what they get, and what invalid input does."""

from types import SimpleNamespace

import pytest
from cuda.bindings import driver
from hypothesis import given, settings
from hypothesis import strategies as st

from rawgraph.cuda.check import CudaError
from rawgraph.cuda.launch import Launch
from rawgraph.graph.patch import compile_program
from rawgraph.graph.plan import PatchPlan
from rawgraph.ops.elementwise import ADD, SILU_MUL
from rawgraph.ops.norm import RMSNORM
from rawgraph.symbols import Range, Symbols, cdiv

X, W, Y = 0x10000, 0x20000, 0x30000  # fake device addresses: nothing is launched here


def _records(S: Symbols) -> list:
    dim = 2048
    norm = Launch(RMSNORM["float16"], S.seq, 256, (X, None, W, Y, None, S.seq, dim, 1e-5),
                  symbols=S)
    add = Launch(ADD["float16"], cdiv(S.seq * dim, 2048), 256, (X, Y, X, S.seq * dim),
                 symbols=S)
    static = Launch(SILU_MUL["float16"], (2, 4), 128, (X, Y, 4, 2048))
    attn = Launch(ADD["float16"], S.past + 1, 256, (X, Y, X, S.past + 1), symbols=S)
    return [("n0", norm), ("n1", add), ("n2", static), ("n3", attn)]


def _plan():
    S = Symbols(seq=Range(1, 512), past=Range(0, 1000), unused=Range(0, 9))
    S.set(seq=16, past=0, unused=0)
    return S, _records(S)


class Recorder:
    def __init__(self, fail_at: int | None = None):
        self.calls, self.fail_at = [], fail_at

    def __call__(self, node, launch):
        if self.fail_at is not None and len(self.calls) == self.fail_at:
            self.fail_at = None
            raise RuntimeError("driver says no")
        self.calls.append((node, launch.grid, launch.args))


@pytest.mark.parametrize(("change", "patched", "check"), [
    # (symbols set, nodes patched, {node: (grid.x, an argument index, its value)})
    ({"seq": 16}, [], {}),
    ({"unused": 3}, [], {}),
    ({"seq": 300}, ["n0", "n1"], {"n0": (300, 5, 300), "n1": (300, 3, 300 * 2048)}),
    ({"seq": 1}, ["n0", "n1"], {"n0": (1, 5, 1), "n1": (1, 3, 2048)}),
    ({"past": 41}, ["n3"], {"n3": (42, 3, 42)}),
    ({"seq": 512, "past": 1000}, ["n0", "n1", "n3"], {"n3": (1001, 3, 1001)}),
])
def test_set_patches_exactly_the_changed_nodes(change, patched, check):
    _, records = _plan()
    plan = PatchPlan(records)
    rec = Recorder()
    assert plan.apply(change, rec) == len(patched)
    assert [c[0] for c in rec.calls] == patched
    for node, grid, args in rec.calls:
        if node in check:
            gx, i, v = check[node]
            assert grid[0] == gx and args[i] == v
    assert plan.apply(change, rec) == 0  # the same values again patch nothing


@pytest.mark.parametrize(("change", "err"), [
    ({"nope": 3}, KeyError),
    ({"seq": 0}, ValueError),
    ({"seq": 513}, ValueError),
    ({"seq": "7"}, TypeError),
    ({"seq": 100, "past": -1}, ValueError),
])
def test_invalid_patch_raises_and_changes_nothing(change, err):
    _, records = _plan()
    plan = PatchPlan(records)
    before = [(L.grid, L.args) for _, _, L in plan.entries]
    rec = Recorder()
    with pytest.raises(err):
        plan.apply(change, rec)
    assert rec.calls == [] and plan.env == {"seq": 16, "past": 0}
    assert [(L.grid, L.args) for _, _, L in plan.entries] == before


def test_rule_giving_an_invalid_grid_is_refused_before_any_patch():
    S = Symbols(k=Range(-5, 5))
    S.set(k=3)
    plan = PatchPlan([("a", Launch(ADD["float16"], S.k, 256, (X, Y, X, 8), symbols=S)),
                      ("b", Launch(ADD["float16"], 1, 256, (X, Y, X, S.k + 10), symbols=S))])
    rec = Recorder()
    with pytest.raises(ValueError, match="grid"):
        plan.apply({"k": 0}, rec)
    assert rec.calls == [] and plan.env == {"k": 3}


def test_driver_failure_midway_restores_patched_nodes():
    _, records = _plan()
    plan = PatchPlan(records)
    rec = Recorder(fail_at=1)  # first node patches, second fails
    with pytest.raises(RuntimeError, match="driver says no"):
        plan.apply({"seq": 300}, rec)
    # the first node was put back to its old values through the setter
    assert rec.calls[0][1][0] == 300 and rec.calls[-1][1][0] == 16
    assert [L.grid[0] for _, _, L in plan.entries[:2]] == [16, 16]
    assert plan.env["seq"] == 16


def test_plan_owns_copies_and_launches_reflect_patches():
    _, records = _plan()
    plan = PatchPlan(records)
    plan.apply({"seq": 64}, Recorder())
    assert records[0][1].grid[0] == 16  # the graph's record is untouched
    launches = plan.launches(records)
    assert launches[0].grid[0] == 64 and launches[2] is records[2][1]


def test_symbols_changed_during_capture_is_an_error():
    S = Symbols(n=Range(1, 100))
    S.set(n=4)
    a = Launch(ADD["float16"], 1, 256, (X, Y, X, S.n), symbols=S)
    S.set(n=5)
    b = Launch(ADD["float16"], 1, 256, (X, Y, X, S.n), symbols=S)
    with pytest.raises(ValueError, match="changed during capture"):
        PatchPlan([("a", a), ("b", b)])


def test_graph_without_symbols_cannot_be_set():
    plan = PatchPlan([("a", Launch(ADD["float16"], 1, 256, (X, Y, X, 8)))])
    with pytest.raises(KeyError, match="no patchable nodes"):
        plan.apply({"n": 1}, Recorder())


# ---- compiled patch programs must do exactly what the generic plan does --------------------



@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([("seq",), ("past",), ("seq", "past"), ("unused",),
                                           ("past", "seq")]),
                          st.integers(-3, 1100), st.integers(-3, 1100)), max_size=12))
def test_compiled_program_matches_generic_apply(steps):
    plans = [PatchPlan(_plan()[1]) for _ in range(3)]
    recs = [Recorder(), Recorder(), FakeDriver(plans[2])]
    for names, x, y in steps:
        values = dict(zip(names, (x, y)))
        progs = [plans[0].apply, compile_program(plans[1], names),
                 compile_program(plans[2], names, recs[2].target())]
        results = []
        for prog, rec in zip(progs, recs):
            try:
                results.append(prog(values, rec))
            except (KeyError, TypeError, ValueError) as e:
                results.append(type(e))
        assert results[0] == results[1] == results[2]
        assert plans[0].env == plans[1].env == plans[2].env
        assert recs[0].calls == recs[1].calls == recs[2].calls
        for p in plans[1:]:
            assert [L.cur for *_, L in plans[0].entries] == [L.cur for *_, L in p.entries]
            assert [L.args for *_, L in plans[0].entries] == [L.args for *_, L in p.entries]


class FakeDriver:
    """Stands in for cuGraphExecKernelNodeSetParams in programs that call the driver inline."""

    def __init__(self, plan, fail_at=None):
        self.calls, self.fail_at = [], fail_at
        self.launch_of = {node: L for _, node, L in plan.entries}

    def target(self):
        def params_for(L):
            L.node_params = L.node_params or SimpleNamespace(gridDimX=0, gridDimY=0, gridDimZ=0)
            return L.node_params

        def set_params(handle, node, p):
            if self.fail_at is not None and len(self.calls) == self.fail_at:
                self.fail_at = None
                return (driver.CUresult.CUDA_ERROR_INVALID_VALUE,)
            L = self.launch_of[node]
            assert (p.gridDimX, p.gridDimY, p.gridDimZ) == L.grid and handle == "exec"
            self.calls.append((node, L.grid, L.args))
            return (driver.CUresult.CUDA_SUCCESS,)

        return ("exec", params_for, set_params)

    def __call__(self, node, L):  # the generic setter, used by rollbacks
        p = L.node_params
        p.gridDimX, p.gridDimY, p.gridDimZ = L.node_grid = L.grid
        self.calls.append((node, L.grid, L.args))


def test_inline_driver_program_rolls_back_and_names_the_error():
    _, records = _plan()
    plan = PatchPlan(records)
    fake = FakeDriver(plan, fail_at=1)
    prog = compile_program(plan, ("seq",), fake.target())
    with pytest.raises(CudaError, match="CUDA_ERROR_INVALID_VALUE"):
        prog({"seq": 300}, fake)
    assert [L.grid[0] for _, _, L in plan.entries[:2]] == [16, 16] and plan.env["seq"] == 16
    assert fake.calls[-1][1][0] == 16  # the first node was set back


def test_compiled_program_rolls_back_on_driver_failure():
    _, records = _plan()
    plan = PatchPlan(records)
    prog = compile_program(plan, ("seq",))
    with pytest.raises(RuntimeError, match="driver says no"):
        prog({"seq": 300}, Recorder(fail_at=1))
    assert [L.grid[0] for _, _, L in plan.entries[:2]] == [16, 16] and plan.env["seq"] == 16
    assert [L.args[5] for _, _, L in plan.entries[:1]] == [16]


def test_unknown_symbol_has_no_program():
    _, records = _plan()
    assert compile_program(PatchPlan(records), ("nope",)) is None


def test_draw_layers_nodes_by_dependency_depth():
    from rawgraph.graph.draw import depths

    fake = SimpleNamespace(nodes=[SimpleNamespace(index=i) for i in range(5)],
                           edges=[(0, 1), (1, 2), (0, 3), (3, 2), (2, 4)])
    assert depths(fake) == {0: 0, 1: 1, 3: 1, 2: 2, 4: 3}
