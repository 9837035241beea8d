"""TMA descriptors for 2-D row-major device arrays (kernels_cu/tma.cuh's TensorMap).

A descriptor holds an array's address, shape and row stride and the box one TMA copy
moves; kernels take it by value (a 128-byte `const __grid_constant__` parameter), so a
graph node carries its own copy and nothing lives in device memory. Encoding is host work
(cuTensorMapEncodeTiled, no stream), cached per (address, shape, dtype, box): a launch that
repeats costs a dictionary lookup.
"""

from __future__ import annotations

import ctypes
import functools

from cuda.bindings import driver

from rawgraph.cuda.check import check

_TYPES = {"float16": driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
          "bfloat16": driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16}
SWIZZLE_BYTES = 128  # the box's rows are 128 bytes in the 128-byte swizzle (wgmma's layout)
BOX_MAX = 256  # elements along one box dimension


def box_check(address: int, rows: int, cols: int, dtype: str, box_rows: int,
              box_cols: int) -> None:
    """ValueError unless a (rows, cols) array of `dtype` at `address` can be read in boxes of
    (box_rows, box_cols) 128-byte-swizzled rows."""
    if dtype not in _TYPES:
        raise ValueError(f"TMA descriptor: unsupported dtype {dtype!r} (use one of "
                         f"{sorted(_TYPES)})")
    if address % 16 or (cols * 2) % 16:
        raise ValueError(f"TMA descriptor: address {address:#x} and row length {cols * 2} B "
                         f"must be multiples of 16 bytes")
    if rows < 1 or cols < 1:
        raise ValueError(f"TMA descriptor: empty array ({rows}, {cols})")
    if not (1 <= box_rows <= BOX_MAX and box_cols * 2 == SWIZZLE_BYTES):
        raise ValueError(f"TMA descriptor: box ({box_rows}, {box_cols}) must be at most "
                         f"{BOX_MAX} rows of {SWIZZLE_BYTES // 2} elements")


@functools.lru_cache(maxsize=1024)
def tile_map(address: int, rows: int, cols: int, dtype: str, box_rows: int,
             box_cols: int = SWIZZLE_BYTES // 2) -> bytes:
    """The 128 bytes of a descriptor for a row-major (rows, cols) array of `dtype` at
    `address`, read in boxes of (box_rows, box_cols) with the 128-byte swizzle; boxes past the
    array's edges are zero-filled."""
    box_check(address, rows, cols, dtype, box_rows, box_cols)
    u32, u64 = driver.cuuint32_t, driver.cuuint64_t
    m = check(driver.cuTensorMapEncodeTiled(
        _TYPES[dtype], u32(2), address, [u64(cols), u64(rows)], [u64(cols * 2)],
        [u32(box_cols), u32(box_rows)], [u32(1), u32(1)],
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        f"TMA descriptor of a ({rows}, {cols}) {dtype} array, box ({box_rows}, {box_cols})")
    return ctypes.string_at(m.getPtr(), 128)  # the struct's bytes, as the kernel reads them
