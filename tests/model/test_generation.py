"""generation_config.json read as transformers writes it (CPU)."""

import json

import pytest

from rawgraph.model import generation
from rawgraph.model.safetensors import CheckpointError


def test_the_defaults_and_eos_ids_a_checkpoint_sets(tmp_path):
    assert generation.read(tmp_path) == generation.GenerationConfig()  # no file: none set
    (tmp_path / generation.FILE).write_text(json.dumps({
        "bos_token_id": 128000, "do_sample": True, "eos_token_id": [128001, 128008, 128009],
        "temperature": 0.6, "top_p": 0.9, "transformers_version": "5.17.0"}))
    g = generation.read(tmp_path)
    assert g.sampling() == {"temperature": 0.6, "top_p": 0.9}
    assert g.eos == (128001, 128008, 128009) and g.unapplied == ()
    (tmp_path / generation.FILE).write_text(json.dumps({
        "eos_token_id": 2, "top_k": 20, "repetition_penalty": 1.05, "min_p": 0.0,
        "typical_p": 0.9}))
    g = generation.read(tmp_path)
    assert g.sampling() == {"top_k": 20, "repetition_penalty": 1.05} and g.eos == (2,)
    assert g.unapplied == ("typical_p=0.9",)  # min_p 0 is neutral


@pytest.mark.parametrize(("text", "match"), [
    ("{broken", "not JSON"), ("[1]", "not a JSON object"),
    (json.dumps({"temperature": -1}), "temperature must be a number"),
    (json.dumps({"temperature": "warm"}), "temperature must be a number"),
    (json.dumps({"top_p": 1.5}), "top_p must be a number"),
    (json.dumps({"top_p": 0}), r"top_p must be a number in \(0"),
    (json.dumps({"top_k": 2**31}), "top_k must be an integer"),
    (json.dumps({"top_k": 2.5}), "top_k must be an integer"),
    (json.dumps({"repetition_penalty": 0}), r"repetition_penalty must be a number in \(0"),
    (json.dumps({"eos_token_id": "x"}), "eos_token_id")])
def test_a_bad_generation_config_is_refused_naming_the_file_and_field(tmp_path, text, match):
    (tmp_path / generation.FILE).write_text(text)
    with pytest.raises(CheckpointError, match=match) as e:
        generation.read(tmp_path)
    assert generation.FILE in str(e.value)
