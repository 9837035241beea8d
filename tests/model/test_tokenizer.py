"""The tokenizer.json wrapper: a round trip, and unreadable files refused by name."""

import pytest

from rawgraph.model.safetensors import CheckpointError


def test_tokenizer_round_trip(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    tok = tokenizers.Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "graphs": 2},
                                                unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    from rawgraph.model.tokenizer import Tokenizer

    t = Tokenizer(tmp_path / "tokenizer.json")
    assert t.encode("hello graphs") == [1, 2] and t.decode([1, 2]) == "hello graphs"
    with pytest.raises(CheckpointError, match=r"missing\.json: no tokenizer file"):
        Tokenizer(tmp_path / "missing.json")
    (tmp_path / "garbage.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"garbage\.json: not a tokenizer\.json"):
        Tokenizer(tmp_path / "garbage.json")
    with pytest.raises(CheckpointError, match="not a file"):
        Tokenizer(tmp_path)
