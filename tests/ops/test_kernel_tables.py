"""The kernel tables are the one source (CPU): gemv.cu's and skinny_sm90.cu's wrappers are
what `python -m rawgraph.ops.generate` writes from them, every kernel in those files is in a
table, and the names and signatures agree."""

import importlib
import re

from rawgraph.cuda.kernel import KERNELS_DIR
from rawgraph.cuda.signature import Signature
from rawgraph.ops import gemv

linear = importlib.import_module("rawgraph.ops.linear")  # the module; ops.linear is the function
_DEFINED = re.compile(r'extern "C" __global__ void(?:\s+__\w+__\([^)]*\))*\s+(\w+)\s*\(')


def test_gemv_cu_is_what_the_table_generates():
    path = KERNELS_DIR / "gemv.cu"
    assert path.read_text() == gemv.source(path), \
        "kernels_cu/gemv.cu's wrappers differ from the table: python -m rawgraph.ops.generate"


def test_every_gemv_kernel_is_in_the_table_once():
    text = (KERNELS_DIR / "gemv.cu").read_text()
    defined = _DEFINED.findall(text)
    table = [k.name for form in (gemv.GEMV, gemv.GEMV_SILU, gemv.GEMV_ROPE)
             for k in form.values()]
    assert sorted(defined) == sorted(table) and len(set(table)) == len(table) == 42


def test_names_keys_and_signatures():
    v = gemv.Variant(16, 4, 4, False, 8, (3, 0, 0))
    assert gemv.name("bfloat16", v, "_silu") == "gemv_bf16_n16_c4_u4_silu"
    assert gemv.GEMV["float16", 8, 1, 8, True, 16].name == "gemv_f16_n8_w16_u8_t"
    for form, epi in ((gemv.GEMV, ""), (gemv.GEMV_SILU, "_silu"), (gemv.GEMV_ROPE, "_rope")):
        for (dt, *_), k in form.items():
            assert k.sig == Signature.parse(gemv.signature(dt, epi))
            assert k.sig == Signature.from_source(KERNELS_DIR / "gemv.cu", k.name)
    assert {v.key[0] for v in gemv.VARIANTS} == set(gemv.M_TILES)


def test_every_launch_the_choice_makes_has_its_kernel():
    for top in (1, 5, 8, 9, 16):
        for n, k in ((2048, 2048), (128256, 4096), (2048, 8192), (64, 264), (28672, 4096)):
            key, grid, threads = gemv.gemv_launch("bfloat16", top, n, k)
            assert key in gemv.GEMV and key in gemv.GEMV_SILU and key in gemv.GEMV_ROPE
            tile, cluster, warps = key[1], key[2], key[5]
            assert tile >= top and threads == 32 * warps
            assert grid == -(-n // gemv.GEMV_ROWS) * cluster
    assert gemv.gemv_launch("float16", 3, 2048, 8192)[0] == ("float16", 8, 1, 8, True, 16)


def test_skinny_sm90_cu_is_what_the_table_generates():
    path = KERNELS_DIR / "skinny_sm90.cu"
    assert path.read_text() == linear.skinny90_source(path), \
        "skinny_sm90.cu's wrappers differ from the table: python -m rawgraph.ops.generate"
    defined = _DEFINED.findall(path.read_text())
    table = [k.name for k in linear.SKINNY90.values()]
    assert sorted(defined) == sorted(table) and len(set(table)) == len(table) == 18
    for k in linear.SKINNY90.values():
        assert k.sig == Signature.from_source(path, k.name)


def test_generate_writes_every_generated_file(tmp_path):
    from rawgraph.ops import generate

    for name in generate.GENERATED:
        (tmp_path / name).write_text((KERNELS_DIR / name).read_text())
    assert generate.main([str(tmp_path)]) == 0
    for name in generate.GENERATED:
        assert (tmp_path / name).read_text() == (KERNELS_DIR / name).read_text()
