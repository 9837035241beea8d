"""Staging: host views copied to the device whole, as a prefix, or as a range of fields."""

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def test_a_push_copies_the_bytes_asked_for_and_leaves_the_rest():
    from rawgraph.memory.staging import Staging

    st = Staging({"a": (np.int32, 4), "b": (np.int64, 3), "c": (np.int32, 5)})
    h = st.begin()
    h["a"][:], h["b"][:], h["c"][:] = 1, 2, 3
    st.push(None)
    h = st.begin()
    h["a"][:], h["b"][:], h["c"][:] = 10, 20, 30
    st.push(None, st.offset("b"))  # a alone
    assert st.dev["a"].get().tolist() == [10] * 4 and st.dev["b"].get().tolist() == [2] * 3
    h = st.begin()
    h["a"][:] = 100
    st.push(None, start=st.offset("c"))  # c to the end alone
    assert st.dev["a"].get().tolist() == [10] * 4 and st.dev["b"].get().tolist() == [2] * 3
    assert st.dev["c"].get().tolist() == [30] * 5
    for bad in ({"nbytes": 0}, {"start": st.nbytes}, {"nbytes": st.nbytes + 1},
                {"start": -1}, {"start": 8, "nbytes": 8}):
        with pytest.raises(ValueError, match="outside"):
            st.push(None, **bad)
