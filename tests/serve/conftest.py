"""The served tiny model the server tests share: a checkpoint with a word-level tokenizer
(word i is token i) and a chat template, and uvicorn serving the app over the NumPy reference
engine on a thread."""

import json
import threading
import time

import pytest

from rawgraph.bench.serve import free_port
from rawgraph.engine.reference import reference_engine
from rawgraph.model.checkpoint import save
from rawgraph.model.config import preset
from rawgraph.model.weights import random_weights
from rawgraph.serve.metrics import Metrics

CFG = preset("tiny").replace(eos=(2,))
CONTEXT = 96
TEMPLATE = ("{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }} "
            "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny checkpoint with a word-level tokenizer (word i is token i) and a chat template."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    root = tmp_path_factory.mktemp("tiny")
    tensors = random_weights(CFG, 11)
    save(root, CFG, tensors)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, CFG.vocab)}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<s>", "</s>"])
    tok.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": TEMPLATE, "bos_token": "<s>", "eos_token": "</s>"}))
    return root, tensors


class Served:
    """uvicorn on a thread, serving the app over a reference engine."""

    def __init__(self, tensors, tokenizer=None, template=None, max_queue=64, start=True,
                 timeout_s=None):
        import uvicorn

        from rawgraph.serve.app import ModelInfo, create_app
        from rawgraph.serve.worker import Worker

        self.engine = reference_engine(CFG, tensors, max_batch=4, max_context=CONTEXT,
                                       max_chunk=32)
        self.worker = Worker(self.engine, Metrics(), max_queue=max_queue)
        if start:
            self.worker.start()
        info = ModelInfo("tiny", CFG.vocab, CONTEXT, tokenizer, template, CFG.eos)
        self.port = free_port()
        app = create_app(self.worker, info, timeout_s=timeout_s)
        self.server = uvicorn.Server(uvicorn.Config(app,
                                                    port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self):
        self.server.should_exit = True
        self.thread.join()
        self.worker.stop()


@pytest.fixture(scope="module")
def served(checkpoint):
    pytest.importorskip("uvicorn")
    pytest.importorskip("starlette")
    from rawgraph.model.tokenizer import Tokenizer
    from rawgraph.serve.text import ChatTemplate

    root, tensors = checkpoint
    s = Served(tensors, Tokenizer(root / "tokenizer.json"),
               ChatTemplate.from_dir(root))
    yield s
    s.close()


def events(lines):
    """The data of each server-sent event; asserts the framing."""
    out = []
    for line in lines:
        if line:
            assert line.startswith("data: "), line
            out.append(line[6:])
    assert out[-1] == "[DONE]"
    return [json.loads(x) for x in out[:-1]]


