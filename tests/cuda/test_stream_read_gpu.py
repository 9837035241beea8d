"""The read-only ceiling of `bench kernels` (kernels_cu/stream_read.cu) against NumPy."""

import cupy
import numpy as np
import pytest

from rawgraph.bench.kernels import stream_read

pytestmark = pytest.mark.gpu


# one word; fewer words than threads; a remainder past whole rounds of 8 loads per thread;
# several grid-wide rounds (4 blocks of 256 per SM x 8 loads x 16 bytes = 17 MB a round)
@pytest.mark.parametrize("nbytes", [16, 16 * 1001, (1 << 20) + 48, (40 << 20) + 16])
def test_stream_read_xors_every_word(stream, rng, nbytes):
    words = rng.integers(0, 2**32, nbytes // 4, dtype=np.uint32)
    buf = cupy.asarray(words)
    out = cupy.asarray(np.array([0x9E3779B9], np.uint32))  # the fold goes into what is there
    cupy.cuda.Device().synchronize()  # inputs made on the default stream; the kernel uses another
    stream_read(buf, out, stream)
    stream_read(buf, out, stream)  # twice: back where it started
    stream_read(buf, out, stream)
    stream.synchronize()
    assert int(out[0]) == 0x9E3779B9 ^ int(np.bitwise_xor.reduce(words))


def test_stream_read_rejects_bad_input():
    out = cupy.zeros(1, np.uint32)
    buf = cupy.zeros(64, np.uint32)
    with pytest.raises(ValueError, match="multiple of 16 bytes, got 12"):
        stream_read(buf[:3], out)
    with pytest.raises(ValueError, match="aligned, got address % 16 = 4"):
        stream_read(buf[1:5], out)
    with pytest.raises(ValueError, match="buf must be C-contiguous"):
        stream_read(buf[::2], out)
    with pytest.raises(ValueError, match=r"CuPy array, got numpy\.ndarray"):
        stream_read(np.zeros(4, np.uint32), out)
    with pytest.raises(ValueError, match="out must be a contiguous uint32"):
        stream_read(buf, cupy.zeros(1, np.int32))
