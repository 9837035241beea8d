"""Kernels as compiled: parameter layouts match the declared signatures, and a compile error
carries NVRTC's log."""

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
