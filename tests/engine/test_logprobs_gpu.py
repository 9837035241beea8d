"""Log-probabilities and the sampling rules through the engine on the GPU: graphs give the
eager launches' tokens and numbers bit for bit (with rules, logprobs, prompt logprobs, a mixed
iteration and overlapped steps), the rules follow their NumPy rule over the model's own
logits step by step, and the numbers match transformers' log_softmax of the same
checkpoint."""

import numpy as np
import pytest

from rawgraph.dtypes import to_float32
from rawgraph.engine import Engine, Request
from rawgraph.model.config import preset
from rawgraph.model.decoder import Model
from rawgraph.model.step import PrefillPiece
from rawgraph.model.weights import random_weights
from rawgraph.ops import SamplingParams
from rawgraph.ops import reference as ref

pytestmark = pytest.mark.gpu
CFG = preset("tiny")
TENSORS = random_weights(CFG, 21)


def _requests(seed=0):
    rng = np.random.default_rng(seed)
    kinds = [SamplingParams(logprobs=5, prompt_logprobs=3),
             SamplingParams(0.8, 30, 0.95, seed=4, logprobs=20, presence_penalty=1.0,
                            frequency_penalty=0.5),
             SamplingParams(repetition_penalty=1.4, logit_bias={3: 5.0, 9: -100.0},
                            logprobs=0),
             SamplingParams(min_tokens=6, logit_bias={2: 30.0}),
             SamplingParams(),
             SamplingParams(prompt_logprobs=0)]
    out = []
    for i in range(12):
        prompt = [int(t) for t in rng.integers(3, CFG.vocab, int(rng.choice([1, 7, 70, 150])))]
        out.append(Request(prompt, int(rng.integers(2, 24)), kinds[i % len(kinds)], stop={2},
                           arrival=int(rng.integers(0, 8)), name=f"r{i}"))
    return out


def _run(graphs, mixed=False, overlap=True):
    model = Model(CFG, TENSORS, max_batch=4, max_context=640, max_chunk=64, max_chunk_seqs=4)
    engine = Engine(model, graphs=graphs, mixed=mixed, overlap=overlap, progress=False)
    reqs = engine.run(_requests())
    engine.close()
    model.close()
    return [(r.output, r.logprobs, r.prompt_logprobs) for r in reqs]


@pytest.mark.parametrize(("mixed", "overlap"), [(False, True), (True, True), (False, False)])
def test_graphs_give_the_eager_tokens_and_logprobs(mixed, overlap):
    eager, graphs = _run(False, mixed, overlap), _run(True, mixed, overlap)
    assert eager == graphs  # Logprob compares its floats exactly
    for (out, lps, plp), r in zip(graphs, _requests()):
        s = r.sampling
        assert len(lps) == (len(out) if s.logprobs is not None else 0)
        assert [e.token for e in lps] == out[:len(lps)]
        assert all(len(e.top) == s.logprobs for e in lps)
        if s.prompt_logprobs is not None:
            assert len(plp) == len(r.prompt) and plp[0] is None
            assert [e.token for e in plp[1:]] == r.prompt[1:]
        if s.min_tokens:  # eos (2) forced by its bias, but banned for min_tokens tokens
            assert 2 not in out[:s.min_tokens]
            if r.max_new_tokens > s.min_tokens:
                assert out[s.min_tokens:] == [2]
        if s.logit_bias and 9 in dict(s.logit_bias):
            assert 9 not in out


def test_rules_follow_the_numpy_rule_over_the_models_logits(stream):
    """One sequence, greedy, every rule on: each token the argmax of apply_rules over the
    logits the same kernels give an eager step without rules."""
    prompt = [5, 6, 7, 5, 40, 41, 5]
    params = SamplingParams(presence_penalty=0.8, frequency_penalty=0.6, repetition_penalty=1.5,
                            logit_bias={11: 2.0, 12: -1.5}, min_tokens=3)
    stop = {int(t) for t in range(20, 24)}
    n = 10
    model = Model(CFG, TENSORS, max_batch=1, max_context=64, max_chunk=64, max_chunk_seqs=1)
    want, ids = [], list(prompt)
    model.prefill([PrefillPiece(0, prompt, 0)], stream)
    x = to_float32(model.pre["logits"][0].get(), CFG.dtype)
    while len(want) < n:
        counts = np.bincount(want, minlength=CFG.vocab)[:CFG.vocab]
        in_prompt = np.zeros(CFG.vocab, bool)
        in_prompt[prompt] = True
        until = dict.fromkeys(stop, len(prompt) + 3 - 1)
        y = ref.apply_rules(x, CFG.dtype, counts=counts, in_prompt=in_prompt, presence=0.8,
                            frequency=0.6, repetition=1.5, bias={11: 2.0, 12: -1.5},
                            until=until, position=len(ids) - 1)
        want.append(int(np.argmax(y)))
        ids.append(want[-1])
        if want[-1] in stop:
            break
        model.decode([0], [want[-1]], stream)
        x = to_float32(model.dec["logits"][0].get(), CFG.dtype)
    model.close()
    model = Model(CFG, TENSORS, max_batch=1, max_context=64, max_chunk=64, max_chunk_seqs=1)
    engine = Engine(model, progress=False)
    (r,) = engine.run([Request(prompt, n, params, stop=stop)])
    engine.close()
    model.close()
    assert r.output == want


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_logprobs_match_transformers_log_softmax(tmp_path, dtype):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from rawgraph.model import checkpoint

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=64,
                                   max_position_embeddings=1024, bos_token_id=None,
                                   eos_token_id=None, pad_token_id=None)
    hf = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.ndim == 1:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.normal_(0, 1)
            else:
                p.normal_(0, p.shape[1] ** -0.5)
    hf.to(getattr(torch, dtype)).save_pretrained(tmp_path)
    rng = np.random.default_rng(3)
    prompt = [int(t) for t in rng.integers(0, 1000, 90)]
    ck = checkpoint.load(tmp_path)
    model = Model.from_checkpoint(ck, max_batch=2, max_context=256, max_chunk=64,
                                  max_chunk_seqs=2)
    engine = Engine(model, progress=False)
    (r,) = engine.run([Request(prompt, 12, SamplingParams(logprobs=5, prompt_logprobs=5))])
    engine.close()
    model.close()
    seq = prompt + r.output

    def log_softmax(dt):
        m = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=dt).cuda().eval()
        with torch.no_grad():
            x = m(torch.tensor([seq], device="cuda")).logits[0].float()
        return torch.log_softmax(x, -1).cpu().numpy()
    want, own = log_softmax(torch.float32), log_softmax(getattr(torch, dtype))
    # the prompt's: token i scored by position i - 1; the output's: by the position before it
    got = np.array([e.logprob for e in r.prompt_logprobs[1:]] + [e.logprob for e in r.logprobs])
    rows = np.arange(len(seq) - 1)
    ref32, ref_own = want[rows, seq[1:]], own[rows, seq[1:]]
    err, hf_err = np.abs(got - ref32).max(), np.abs(ref_own - ref32).max()
    print(f"max |logprob error|: rawgraph {err:.4f}, transformers {dtype} {hf_err:.4f}")
    assert err <= 1.5 * hf_err + 1e-3, (err, hf_err)
    # the top alternatives: transformers' own in its order where they are not near ties
    for i, e in enumerate(r.logprobs):
        row = want[len(prompt) - 1 + i]
        top = [t for t, _ in e.top]
        assert set(top[:1]) == {int(np.argmax(row))} or \
            abs(row[top[0]] - row.max()) < 2 * hf_err
        np.testing.assert_allclose([v for _, v in e.top], row[top], atol=1.5 * hf_err + 1e-3)
