"""Generated text released as it becomes final, stop strings, and chat templates rendered as
transformers renders them (CPU)."""

import pytest

from rawgraph.model.safetensors import CheckpointError
from rawgraph.serve.text import ChatTemplate, TextStream

WORDS = ["", "he", "llo", " wor", "ld", "\n", "STOP", "é"]


def _decode(ids):
    return "".join(WORDS[i] for i in ids)


def test_text_comes_out_once_and_whole():
    s = TextStream(_decode, [])
    assert [s.push([i]) for i in (1, 2, 3, 4)] == ["he", "llo", " wor", "ld"]
    assert s.finish() == "" and not s.stopped


def test_a_stop_string_ends_the_text_before_it_even_across_tokens():
    s = TextStream(_decode, ["wor", "xyz"])
    out = [s.push([1]), s.push([2]), s.push([3])]
    assert "".join(out) == "hello " and s.stopped
    assert s.push([4]) == "" and s.finish() == ""
    s = TextStream(_decode, ["o w"])  # spans the tokens "llo" and " wor"
    text = s.push([1]) + s.push([2]) + s.push([3])
    assert text == "hell" and s.stopped


def test_text_that_may_begin_a_stop_string_is_held_until_it_cannot():
    s = TextStream(_decode, ["ld!"])
    assert s.push([1, 2, 3]) == "hello w"  # "or" could still begin nothing; "ld!" needs 2 held
    assert s.push([4]) == "or"             # "ld" might be "ld!": held
    assert s.finish() == "ld"


def test_an_incomplete_character_is_held():
    pieces = {1: "a", 2: "\ufffd", 3: "\u00e9"}

    def decode(ids):  # ids (1, 2) decode to "a\ufffd" until the next byte arrives
        text = "".join(pieces[i] for i in ids)
        return text.replace("\ufffd\u00e9", "\u00e9")
    s = TextStream(decode, [])
    assert s.push([1, 2]) == "a"
    assert s.push([3]) == "\u00e9"


def _bpe(kind):
    """A small BPE tokenizer trained here: byte-level (LLaMA 3's kind) or metaspace
    (sentencepiece's, LLaMA 2's: the spacing of a token depends on what precedes it)."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    if kind == "bytes":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        alphabet = []
    tok.train_from_iterator(CORPUS * 20, trainers.BpeTrainer(vocab_size=300,
                                                               initial_alphabet=alphabet))
    return tok


CORPUS = ["graphs replay kernels", "the decode step patches its nodes", "caf\u00e9 na\u00efve",
          "\u8a00\u8a9e\u30e2\u30c7\u30eb \U0001f680 launch", "  two  spaces and a\ttab\n"]


@pytest.mark.parametrize("kind", ["bytes", "metaspace"])
def test_streamed_text_is_the_whole_decode_and_each_token_decodes_a_short_window(kind):
    tok = _bpe(kind)
    seen = []

    def decode(ids):
        seen.append(len(ids))
        return tok.decode(ids)
    text = " ".join(CORPUS) + " \U0001f680\U0001f680 caf\u00e9"
    ids = tok.encode(text).ids
    s = TextStream(decode, [])
    out = "".join(s.push([i]) for i in ids) + s.finish()
    assert out == tok.decode(ids)
    assert max(seen) <= 8 < len(ids)  # a window, not every id so far


TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}"
            "<<SYS>>{{ m.content | trim }}<</SYS>>\n{% else %}[{{ m.role | upper }}] "
            "{{ m.content }}\n{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}[ASSISTANT] {% endif %}")


def test_chat_template_renders_messages_with_the_special_tokens(tmp_path):
    t = ChatTemplate(TEMPLATE, "<s>", "</s>")
    text = t.render([{"role": "system", "content": " be brief "},
                     {"role": "user", "content": "hi"}])
    assert text == "<s><<SYS>>be brief<</SYS>>\n[USER] hi\n[ASSISTANT] "
    strict = ChatTemplate("{% if messages[0].role != 'user' %}"
                          "{{ raise_exception('a user must speak first') }}{% endif %}x")
    with pytest.raises(ValueError, match="a user must speak first"):
        strict.render([{"role": "assistant", "content": "x"}])


def test_chat_template_from_tokenizer_config(tmp_path):
    import json

    cfg = tmp_path / "tokenizer_config.json"
    assert ChatTemplate.from_dir(tmp_path) is None
    cfg.write_text(json.dumps({"chat_template": [{"name": "default", "template": TEMPLATE}],
                               "bos_token": {"content": "<s>"}, "eos_token": "</s>"}))
    t = ChatTemplate.from_dir(tmp_path)
    assert t.bos_token == "<s>" and t.eos_token == "</s>"
    cfg.write_text(json.dumps({"bos_token": "<s>"}))
    assert ChatTemplate.from_dir(tmp_path) is None
    cfg.write_text("{broken")
    with pytest.raises(CheckpointError, match=r"tokenizer_config\.json: not JSON"):
        ChatTemplate.from_dir(tmp_path)
    cfg.write_text(json.dumps({"chat_template": "{% for %}"}))
    with pytest.raises(CheckpointError, match="does not compile"):
        ChatTemplate.from_dir(tmp_path)
    cfg.write_text(json.dumps({"chat_template": 7}))
    with pytest.raises(CheckpointError, match="chat_template must be a string"):
        ChatTemplate.from_dir(tmp_path)


def test_chat_template_where_transformers_5_writes_it(tmp_path):
    # transformers >= 4.52 writes chat_template.jinja and leaves it out of
    # tokenizer_config.json; processors wrote chat_template.json. The .jinja file wins.
    import json

    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>",
                                                                "eos_token": "</s>"}))
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": "json:"
                                                             "{{ messages[0].content }}"}))
    assert ChatTemplate.from_dir(tmp_path).render([{"role": "user", "content": "a"}]) == "json:a"
    (tmp_path / "chat_template.jinja").write_text(TEMPLATE)
    t = ChatTemplate.from_dir(tmp_path)
    assert (t.bos_token, t.eos_token) == ("<s>", "</s>")
    assert t.render([{"role": "user", "content": "hi"}]) == \
        ChatTemplate(TEMPLATE, "<s>", "</s>").render([{"role": "user", "content": "hi"}])
    (tmp_path / "tokenizer_config.json").unlink()  # no special tokens named: empty
    assert ChatTemplate.from_dir(tmp_path).bos_token == ""
    (tmp_path / "chat_template.jinja").write_bytes(b"\xff\xfe{{")
    with pytest.raises(CheckpointError, match=r"chat_template\.jinja: not readable text"):
        ChatTemplate.from_dir(tmp_path)


def test_chat_template_matches_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models

    tok = tokenizers.Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2},
                                                unk_token="<unk>"))
    tok.save(str(tmp_path / "tokenizer.json"))
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"),
                                              bos_token="<s>", eos_token="</s>",
                                              chat_template=TEMPLATE)
    msgs = [{"role": "system", "content": " be brief "}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    want = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert ChatTemplate(TEMPLATE, "<s>", "</s>").render(msgs) == want
