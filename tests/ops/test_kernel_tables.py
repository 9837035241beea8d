"""The kernel tables are the one source (CPU): the `extern "C"` wrappers at the end of each
generated .cu file are what `python -m rawgraph.ops.generate` writes from them, every kernel
in those files is in a table once, and the names and signatures agree."""

import re

import pytest

from rawgraph.cuda.generated import forward, wrapper
from rawgraph.cuda.kernel import KERNELS_DIR
from rawgraph.cuda.signature import Signature
from rawgraph.ops import attention, gemv, generate, norm
from rawgraph.ops.matmul import GEMM, GEMM90, GEMM90_SILU, SKINNY, SKINNY90, SKINNY90_SILU

_DEFINED = re.compile(r'extern "C" __global__ void(?:\s+__\w+__\([^)]*\))*\s+(\w+)\s*\(')
TABLES = {"gemv.cu": (gemv.GEMV, gemv.GEMV_SILU, gemv.GEMV_ROPE),
          "gemv_quant.cu": tuple(f for forms in gemv.GEMV_QUANT.values() for f in forms),
          "skinny.cu": (SKINNY,),
          "skinny_sm90.cu": (SKINNY90, SKINNY90_SILU), "gemm.cu": (GEMM,),
          "gemm_sm90.cu": (GEMM90, GEMM90_SILU),
          "decode_attention.cu": (attention.ATTEND, attention.COMBINE),
          "prefill_attention.cu": (attention.PREFILL, attention.PREFILL_SPLIT,
                                   attention.PREFILL_COMBINE),
          "prefill_attention_sm90.cu": (attention.PREFILL90, attention.PREFILL90_SPLIT,
                                        attention.PREFILL90T, attention.PREFILL90T_SPLIT),
          # fold_norm's wrappers are hand-written, above the generated ones
          "rmsnorm.cu": (norm.RMSNORM, norm.RMSNORM_ROWS, norm.FOLD)}


@pytest.mark.parametrize("name", sorted(generate.GENERATED))
def test_each_file_is_what_its_tables_generate(name):
    path = KERNELS_DIR / name
    assert path.read_text() == generate.source(path), \
        f"kernels_cu/{name}'s wrappers differ from the table: python -m rawgraph.ops.generate"
    kernels = [k for table in TABLES[name] for k in table.values()]
    assert sorted(_DEFINED.findall(path.read_text())) == sorted(k.name for k in kernels)
    assert len({k.name for k in kernels}) == len(kernels)
    for k in kernels:
        assert k.sig == Signature.from_source(path, k.name)
    assert set(TABLES) == set(generate.GENERATED)


def test_gemv_has_36_forms_and_variants_and_60_of_quantized_weights():
    assert sum(len(f) for f in TABLES["gemv.cu"]) == 36
    assert sum(len(f) for f in gemv.GEMV_QUANT["e4m3"]) == 30
    assert sum(len(f) for f in gemv.GEMV_QUANT["i4"]) == 30


def test_wrappers_pass_parameters_on_and_wrap_at_100_columns():
    params = ("const __grid_constant__ TensorMap xmap, const __grid_constant__ TensorMap wmap, "
              "const __half* residual, __half* y, int m, int n, int k")
    assert forward(params) == "&xmap, &wmap, residual, y, m, n, k"
    text = wrapper("k", params, f"impl<__half, 64>({forward(params)});", "__launch_bounds__(160)")
    assert text.splitlines()[:2] == ['extern "C" __global__ void __launch_bounds__(160)', "k("]
    assert all(len(line) <= 100 for line in text.splitlines())
    assert Signature.parse(re.search(r"k\(([^)]*)\)", text)[1]) == Signature.parse(params)


def test_names_keys_and_signatures():
    v = gemv.Variant(16, 4, False, 8, (3, 0, 0))
    assert gemv.name("bfloat16", v, "_silu") == "gemv_bf16_n16_u4_silu"
    assert gemv.GEMV["float16", 8, 8, True, 16].name == "gemv_f16_n8_w16_u8_t"
    for form, epi in ((gemv.GEMV, ""), (gemv.GEMV_SILU, "_silu"), (gemv.GEMV_ROPE, "_rope")):
        for (dt, *_), k in form.items():
            assert k.sig == Signature.parse(gemv.signature(dt, epi))
            assert k.sig == Signature.from_source(KERNELS_DIR / "gemv.cu", k.name)
    assert {v.key[0] for v in gemv.VARIANTS} == set(gemv.M_TILES)
    assert all(k.op == "gemv_quant" for f in TABLES["gemv_quant.cu"] for k in f.values())
    # quantized weights: their arrays (and the group) where the 16-bit forms take w
    assert gemv.name("float16", gemv.F8_VARIANTS[1], "", "e4m3") == "gemv_f16_e4m3_n8_u4_t"
    assert gemv.name("bfloat16", gemv.I4_VARIANTS[0], "_silu", "i4") == "gemv_bf16_i4_n8_u4_silu"
    takes = {"e4m3": ["w", "w_scale"], "i4": ["w", "w_scales", "w_zeros", "group"]}
    for fmt, forms in gemv.GEMV_QUANT.items():
        for form, epi in zip(forms, gemv.EPILOGUES):
            for (dt, *_), k in form.items():
                assert f"_{fmt}_" in k.name
                assert k.name.endswith(epi) if epi else not k.name.endswith(("_silu", "_rope"))
                params, t = [p.name for p in k.sig.params], len(takes[fmt])
                assert params[1:1 + t] == takes[fmt] and params[:1] + params[1 + t:] == \
                    [p.name for p in Signature.parse(gemv.signature(dt, epi)).params
                     if p.name != "w"]
                assert k.sig.params[1].ctype == "const unsigned char*"
        assert {v.key[0] for v in gemv.QUANT_VARIANTS[fmt]} == set(gemv.M_TILES)


def test_every_launch_the_choice_makes_has_its_kernel():
    for top in (1, 5, 8, 9, 16):
        for n, k in ((2048, 2048), (128256, 4096), (2048, 8192), (64, 264), (28672, 4096)):
            key, grid, threads = gemv.gemv_launch("bfloat16", top, n, k)
            assert key in gemv.GEMV and key in gemv.GEMV_SILU and key in gemv.GEMV_ROPE
            tile, warps = key[1], key[4]
            assert tile >= top and threads == 32 * warps
            assert grid == -(-n // gemv.GEMV_ROWS)
    assert gemv.gemv_launch("float16", 3, 2048, 8192)[0] == ("float16", 8, 8, True, 16)
    for fmt, forms in gemv.GEMV_QUANT.items():  # the quantized weights' forms
        for top in (1, 5, 8, 9, 16):
            for n, k in ((2048, 2048), (128256, 4096), (2048, 16384), (64, 256), (28672, 4096),
                         (4096, 14336), (2048, 65536)):
                key, grid, threads = gemv.gemv_launch("float16", top, n, k, fmt)
                assert all(key in form for form in forms), (fmt, top, n, k)
                assert key[1] >= top and threads == 32 * key[4] and grid == -(-n // 16)


def test_generate_writes_every_generated_file(tmp_path):
    for name in generate.GENERATED:
        (tmp_path / name).write_text((KERNELS_DIR / name).read_text())
    assert generate.main([str(tmp_path)]) == 0
    for name in generate.GENERATED:
        assert (tmp_path / name).read_text() == (KERNELS_DIR / name).read_text()
