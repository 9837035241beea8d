"""Kernels as compiled: parameter layouts match the declared signatures, and a compile error
carries NVRTC's log."""

import cupy
import pytest

from rawgraph.ops.elementwise import ADD, SILU_MUL
from rawgraph.ops.norm import FOLD, RMSNORM

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("kernel", [*ADD.values(), *SILU_MUL.values(), *RMSNORM.values(),
                                    *FOLD.values()])
def test_compiled_parameters_match_declared_signature(kernel):
    info = kernel.param_info()  # loading already cross-checked the sizes; check layout too
    assert [s for _, s in info] == [p.size for p in kernel.sig.params]
    assert [o for o, _ in info] == sorted(o for o, _ in info)


def test_compile_error_carries_the_nvrtc_log(tmp_path, monkeypatch):
    from rawgraph import CompileError, Kernel
    from rawgraph.cuda import kernel as kmod

    (tmp_path / "broken_op.cu").write_text(
        'extern "C" __global__ void broken(float* y, int n) { y[0] = undefined_name; }\n')
    monkeypatch.setattr(kmod, "KERNELS_DIR", tmp_path)
    k = Kernel("broken_op", "broken", "float* y, int n")
    with pytest.raises(CompileError, match="undefined_name") as e:
        k.launch(1, 32, (None, 1))
    assert "broken_op.cu" in str(e.value) and "undefined_name" in e.value.log


def test_precompile_loads_every_module_of_this_device_and_names_a_failing_one(tmp_path,
                                                                              monkeypatch):
    from rawgraph import CompileError
    from rawgraph.cuda import kernel as kmod
    from rawgraph.cuda.device import compute_capability

    ops = kmod.loadable_ops()
    hopper = compute_capability() == (9, 0)
    assert all((op in ops) == hopper for op in kmod.ARCH_SPECIFIC)
    assert {"decode_attention", "gemv", "sample"} <= set(ops)
    kmod.precompile()  # on one thread a CPU; then each module is a lookup

    def compile_again(*args, **kwargs):
        raise AssertionError("a module precompile loaded was compiled again")

    with monkeypatch.context() as m:
        m.setattr(cupy.cuda.compiler, "_compile_module_with_cache", compile_again)
        for op in ops:
            kmod.compiled(op)

    (tmp_path / "good_op.cu").write_text('extern "C" __global__ void good(float* y) {}\n')
    (tmp_path / "bad_op.cu").write_text(
        'extern "C" __global__ void bad(float* y) { y[0] = missing_name; }\n')
    monkeypatch.setattr(kmod, "KERNELS_DIR", tmp_path)
    assert kmod.loadable_ops() == ["bad_op", "good_op"]
    with pytest.raises(CompileError, match=r"bad_op\.cu") as e:
        kmod.precompile(workers=2)
    assert "missing_name" in e.value.log
