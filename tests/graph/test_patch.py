"""Patching without a GPU: which nodes change, what they get, what invalid input and a driver
refusal do; the patch program against the launches' own expressions."""

from types import SimpleNamespace

import pytest
from cuda.bindings import driver
from hypothesis import given, settings
from hypothesis import strategies as st

from rawgraph.cuda.check import CudaError
from rawgraph.cuda.launch import Launch
from rawgraph.graph.patch import PatchPlan
from rawgraph.ops.elementwise import ADD, SILU_MUL
from rawgraph.ops.norm import RMSNORM
from rawgraph.symbols import Range, Symbols, cdiv, resolve

X, W, Y = 0x10000, 0x20000, 0x30000  # fake device addresses: nothing is launched here
OK, REFUSED = driver.CUresult.CUDA_SUCCESS, driver.CUresult.CUDA_ERROR_INVALID_VALUE


def _records(S: Symbols) -> list:
    dim = 2048
    norm = Launch(RMSNORM["float16"], S.seq, 256, (X, None, W, Y, None, S.seq, dim, 1e-5, None,
                                                    512),
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


class FakeDriver:
    """Stands in for cuGraphExecKernelNodeSetParams: records (node, grid, args) of each
    call as the node's params and storage hold them; refuses the call number `fail_at`."""

    def __init__(self, plan, fail_at=None):
        self.calls, self.fail_at = [], fail_at
        self.node = {n.handle: n for n in plan.nodes}

    def params(self, node):
        node.params = node.params or SimpleNamespace(gridDimX=0, gridDimY=0, gridDimZ=0)
        return node.params

    def __call__(self, handle, node, p):
        assert handle == "exec"
        if self.fail_at is not None and len(self.calls) == self.fail_at:
            self.fail_at = None
            return (REFUSED,)
        n = self.node[node]
        self.calls.append((node, (p.gridDimX, p.gridDimY, p.gridDimZ), n.pack.values))
        return (OK,)

    def program(self, plan, names):
        return plan.program(names, "exec", self, self.params)


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
    fake = FakeDriver(plan)
    prog = fake.program(plan, tuple(change))
    assert prog(change) == len(patched)
    assert [c[0] for c in fake.calls] == patched
    for node, grid, args in fake.calls:
        if node in check:
            gx, i, v = check[node]
            assert grid[0] == gx and args[i] == v
    assert prog(change) == 0  # the same values again patch nothing


@pytest.mark.parametrize(("change", "err"), [
    ({"seq": 0}, ValueError),
    ({"seq": 513}, ValueError),
    ({"seq": "7"}, TypeError),
    ({"seq": 100, "past": -1}, ValueError),
])
def test_invalid_patch_raises_and_changes_nothing(change, err):
    _, records = _plan()
    plan = PatchPlan(records)
    before = [(n.grid, n.args, n.pack.values) for n in plan.nodes]
    fake = FakeDriver(plan)
    with pytest.raises(err):
        fake.program(plan, tuple(change))(change)
    assert fake.calls == [] and plan.env == {"seq": 16, "past": 0}
    assert [(n.grid, n.args, n.pack.values) for n in plan.nodes] == before


def test_an_unknown_symbol_or_a_graph_without_symbols_has_no_program():
    _, records = _plan()
    plan = PatchPlan(records)
    with pytest.raises(KeyError, match="unknown symbol 'nope'"):
        plan.program(("seq", "nope"), "exec", FakeDriver(plan))
    bare = PatchPlan([("a", Launch(ADD["float16"], 1, 256, (X, Y, X, 8)))])
    with pytest.raises(KeyError, match="no patchable nodes"):
        bare.program(("n",), "exec", FakeDriver(bare))


def test_rule_giving_an_invalid_grid_is_refused_before_any_patch():
    S = Symbols(k=Range(-5, 5))
    S.set(k=3)
    plan = PatchPlan([("a", Launch(ADD["float16"], S.k, 256, (X, Y, X, 8), symbols=S)),
                      ("b", Launch(ADD["float16"], 1, 256, (X, Y, X, S.k + 10), symbols=S))])
    fake = FakeDriver(plan)
    with pytest.raises(ValueError, match="grid"):
        fake.program(plan, ("k",))({"k": 0})
    assert fake.calls == [] and plan.env == {"k": 3}


def test_driver_failure_midway_puts_back_the_nodes_patched_and_names_the_error():
    _, records = _plan()
    plan = PatchPlan(records)
    fake = FakeDriver(plan, fail_at=1)  # first node patches, second is refused
    with pytest.raises(CudaError, match="CUDA_ERROR_INVALID_VALUE"):
        fake.program(plan, ("seq",))({"seq": 300})
    assert fake.calls[0][1][0] == 300 and fake.calls[-1][1][0] == 16  # the first, set back
    assert [n.grid[0] for n in plan.nodes[:2]] == [16, 16] and plan.env["seq"] == 16
    assert plan.nodes[0].pack.values[5] == 16 and plan.nodes[0].args == (16,)


def test_plan_owns_copies_and_launches_reflect_patches():
    _, records = _plan()
    plan = PatchPlan(records)
    FakeDriver(plan).program(plan, ("seq",))({"seq": 64})
    assert records[0][1].grid[0] == 16 and records[0][1].args[5] == 16  # captured: untouched
    launches = plan.launches(records)
    assert launches[0].grid[0] == 64 and launches[0].args[5] == 64
    assert launches[2] is records[2][1]  # not patchable: the record itself
    assert PatchPlan(records).nodes[0].grid[0] == 16  # another executable: its own records


def test_symbols_changed_during_capture_is_an_error():
    S = Symbols(n=Range(1, 100))
    S.set(n=4)
    a = Launch(ADD["float16"], 1, 256, (X, Y, X, S.n), symbols=S)
    S.set(n=5)
    b = Launch(ADD["float16"], 1, 256, (X, Y, X, S.n), symbols=S)
    with pytest.raises(ValueError, match="changed during capture"):
        PatchPlan([("a", a), ("b", b)])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([("seq",), ("past",), ("seq", "past"), ("unused",),
                                           ("past", "seq")]),
                          st.integers(-3, 1100), st.integers(-3, 1100)), max_size=12))
def test_programs_give_every_node_what_its_expressions_say(steps):
    """After any sequence of sets (valid or not), each node holds its launch's templates
    evaluated at the plan's values, the driver saw exactly the nodes that changed, and a
    refused set changed nothing."""
    S, records = _plan()
    plan = PatchPlan(records)
    fake = FakeDriver(plan)
    env = {"seq": 16, "past": 0, "unused": 0}
    for names, x, y in steps:
        values = dict(zip(names, (x, y)))
        fake.calls.clear()
        try:
            S.validate(values)
            ok = True
        except (TypeError, ValueError):
            ok = False
        if not ok:
            with pytest.raises((TypeError, ValueError)):
                fake.program(plan, names)(values)
            assert fake.calls == []
            continue
        want = {**env, **values}
        changed = [n.handle for n in plan.nodes
                   if tuple(resolve(g, want) for g in n.launch.grid_t) != n.grid
                   or tuple(resolve(n.launch.args_t[i], want) for i in n.dyn) != n.args]
        assert fake.program(plan, names)(values) == len(changed)
        assert [c[0] for c in fake.calls] == changed
        env = want
        for n in plan.nodes:
            assert n.grid == tuple(resolve(g, env) for g in n.launch.grid_t)
            assert n.pack.values == tuple(resolve(t, env) if i in n.dyn else n.launch.args[i]
                                          for i, t in enumerate(n.launch.args_t))


def test_draw_layers_nodes_by_dependency_depth():
    from rawgraph.graph.draw import depths

    fake = SimpleNamespace(nodes=[SimpleNamespace(index=i) for i in range(5)],
                           edges=[(0, 1), (1, 2), (0, 3), (3, 2), (2, 4)])
    assert depths(fake) == {0: 0, 1: 1, 3: 1, 2: 2, 4: 3}


# ---- variants: nodes launched inside `when(case)` switch on and off as their case holds ------

def _variant_records(S: Symbols) -> list:
    """Two variants of one op over S.seq (1-8 and 9-512), and a node outside them."""
    from rawgraph.cuda.launch import when
    from rawgraph.symbols import Case

    records = []
    for name, spans in (("small", ((1, 8),)), ("large", ((9, 512),))):
        with when(Case(S.seq, spans)):
            records.append((name, Launch(ADD["float16"], cdiv(S.seq, 4), 256,
                                         (X, Y, X, S.seq), symbols=S)))
    records.append(("after", Launch(ADD["float16"], 1, 256, (X, Y, X, 7), symbols=S)))
    return records


class FakeSwitch:
    """Stands in for cuGraphNodeSetEnabled: records (node, on) of each call; refuses the call
    number `fail_at`."""

    def __init__(self, fail_at=None):
        self.calls, self.fail_at = [], fail_at

    def __call__(self, handle, node, on):
        assert handle == "exec"
        if self.fail_at is not None and len(self.calls) == self.fail_at:
            self.fail_at = None
            return (REFUSED,)
        self.calls.append((node, on))
        return (OK,)


def _variant_plan(seq: int):
    S = Symbols(seq=Range(1, 512))
    S.set(seq=seq)
    return PatchPlan(_variant_records(S))


@pytest.mark.parametrize(("seq", "to", "switched", "patched"), [
    # (value at capture, value set, switches made, params set)
    (5, 6, [], ["small", "large"]),                     # the same variant: params only
    (5, 8, [], ["small", "large"]),
    (5, 9, [("small", 0), ("large", 1)], ["small", "large"]),
    (200, 3, [("small", 1), ("large", 0)], ["small", "large"]),
    (9, 512, [], ["small", "large"]),                    # the off variant's params follow
    (5, 5, [], []),
])
def test_variants_switch_where_their_case_starts_or_stops_holding(seq, to, switched, patched):
    plan = _variant_plan(seq)
    assert [n.enabled for n in plan.nodes if n.case] == [seq <= 8, seq > 8]
    fake, switch = FakeDriver(plan), FakeSwitch()
    prog = plan.program(("seq",), "exec", fake, fake.params, switch)
    n = prog({"seq": to})
    assert switch.calls == switched
    assert sorted(c[0] for c in fake.calls) == sorted(patched)
    assert n == len(fake.calls) + len(switch.calls)
    assert [n.enabled for n in plan.nodes if n.case] == [to <= 8, to > 8]
    runs = [L.args[3] for L in plan.launches(_variant_records(plan.symbols))]
    assert len(runs) == 2  # the enabled variant and the node after: never both variants


def test_a_refused_switch_puts_back_every_node_it_changed():
    plan = _variant_plan(5)
    fake, switch = FakeDriver(plan), FakeSwitch(fail_at=1)  # the second switch fails
    prog = plan.program(("seq",), "exec", fake, fake.params, switch)
    before = {n.handle: (n.grid, n.args, n.enabled) for n in plan.nodes}
    with pytest.raises(CudaError, match="switch add_f16"):
        prog({"seq": 100})
    assert {n.handle: (n.grid, n.args, n.enabled) for n in plan.nodes} == before
    assert plan.env["seq"] == 5
    assert switch.calls[-1] == ("small", 1)  # switched back


def test_a_graph_with_variants_needs_the_switch():
    plan = _variant_plan(5)
    fake = FakeDriver(plan)
    with pytest.raises(ValueError, match="set_enabled"):
        plan.program(("seq",), "exec", fake, fake.params)


def test_variants_do_not_nest():
    from rawgraph.cuda.launch import when
    from rawgraph.symbols import Case, Sym

    with when(Case(Sym("a"), ((1, 2),))), pytest.raises(ValueError, match="do not nest"):
        with when(Case(Sym("a"), ((3, 4),))):
            pass
