"""TMA descriptors: the checks made before encoding (no GPU), and the encoding (GPU)."""

import pytest

from rawgraph.cuda.tensormap import box_check


@pytest.mark.parametrize("args, match", [
    ((0x1008, 64, 64, "float16", 64, 64), "multiples of 16"),     # address
    ((0x1000, 64, 60, "float16", 64, 64), "multiples of 16"),     # row of 120 bytes
    ((0x1000, 64, 64, "float32", 64, 64), "unsupported dtype"),
    ((0x1000, 64, 64, "float16", 512, 64), "at most 256 rows"),
    ((0x1000, 64, 64, "bfloat16", 64, 32), "of 64 elements"),     # not the 128-byte swizzle
    ((0x1000, 0, 64, "float16", 64, 64), "empty"),
])
def test_box_check_names_the_problem(args, match):
    with pytest.raises(ValueError, match=match):
        box_check(*args)


def test_box_check_accepts_gemm_operands():
    box_check(0x7F0000001000, 4096, 2048, "bfloat16", 128, 64)
    box_check(0x7F0000001000, 1, 8, "float16", 256, 64)  # boxes past the edges: zero-filled


@pytest.mark.gpu
def test_tile_map_is_128_bytes_and_cached():
    import cupy
    import numpy as np

    from rawgraph.cuda.tensormap import tile_map

    x = cupy.zeros((300, 72), np.float16)
    a = tile_map(x.data.ptr, 300, 72, "float16", 128)
    assert isinstance(a, bytes) and len(a) == 128
    assert tile_map(x.data.ptr, 300, 72, "float16", 128) is a
    assert tile_map(x.data.ptr, 300, 72, "float16", 64) != a
