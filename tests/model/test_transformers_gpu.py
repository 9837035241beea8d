"""Parity with transformers: random *ForCausalLM checkpoints of every family (LLaMA, Qwen2,
Qwen3, Mistral) saved by `save_pretrained`
(safetensors; bf16 and fp16; one sharded; head_dim 64 and 128; GQA groups 1 to 8; tied and
untied heads; every RoPE type rawgraph reads, llama3 with prompts of 2,100 and 32,768
tokens; random norm weights), loaded by rawgraph, prefilled in chunks and decoded step by
step. The logits of the prompt's last position and of every decode step are compared with
transformers' float32 forward of the same weights: rawgraph's error must be no worse than
1.5x that of transformers' own bf16/fp16 forward. Skipped where torch or transformers is
absent; neither is ever imported by rawgraph itself."""

import json

import cupy
import numpy as np
import pytest

from rawgraph.cuda.stream import new_stream
from rawgraph.dtypes import to_float32
from rawgraph.model import checkpoint
from rawgraph.model.config import ModelConfig
from rawgraph.model.decoder import Model
from rawgraph.model.step import PrefillPiece
from rawgraph.ops.rope import attention_factor, inv_freq

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

DECODE = 8  # decode steps after the prompt
CHUNK = 512

# (id, dims, rope_parameters, prompt length, dtype, shard)
CASES = [
    ("d64-g4-tied-bf16", dict(hidden_size=512, num_attention_heads=8, num_key_value_heads=2,
                              head_dim=64, tie_word_embeddings=True),
     {"rope_type": "default", "rope_theta": 10000.0}, 67, "bfloat16", False),
    ("d128-g1-untied-fp16", dict(hidden_size=512, num_attention_heads=4,
                                 num_key_value_heads=4, head_dim=128),
     {"rope_type": "default", "rope_theta": 500000.0}, 100, "float16", False),
    ("d64-g8-llama3-2100-bf16-sharded",
     dict(hidden_size=512, num_attention_heads=8, num_key_value_heads=1, head_dim=64,
          max_position_embeddings=4096),
     {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 256}, 2100, "bfloat16", True),
    ("d64-g4-llama3-32k-bf16",  # a long prompt: 64 chunks through the paged cache
     dict(hidden_size=512, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
          max_position_embeddings=131072),
     {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, 32768, "bfloat16",
     False),
    ("d128-g2-yarn-fp16", dict(hidden_size=512, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=128, max_position_embeddings=4096),
     {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
      "original_max_position_embeddings": 1024}, 1300, "float16", False),
    ("d64-g2-linear-bf16", dict(hidden_size=256, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=64, tie_word_embeddings=True),
     {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}, 300, "bfloat16", False),
    ("d64-g1-dynamic-fp16", dict(hidden_size=256, num_attention_heads=4,
                                 num_key_value_heads=4, head_dim=64,
                                 max_position_embeddings=1024),
     {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}, 200, "float16", False),
    # the other families (model_type), tied and untied, GQA and not, both dtypes
    ("qwen2-d64-g4-tied-bf16", dict(model_type="qwen2", hidden_size=512, num_attention_heads=8,
                                    num_key_value_heads=2, head_dim=64,
                                    tie_word_embeddings=True),
     {"rope_type": "default", "rope_theta": 1000000.0}, 700, "bfloat16", False),
    ("qwen2-d128-g1-untied-fp16", dict(model_type="qwen2", hidden_size=512,
                                       num_attention_heads=4, num_key_value_heads=4,
                                       head_dim=128),
     {"rope_type": "default", "rope_theta": 1000000.0}, 300, "float16", False),
    ("qwen3-d128-g2-untied-bf16", dict(model_type="qwen3", hidden_size=256,
                                       num_attention_heads=4, num_key_value_heads=2,
                                       head_dim=128),
     {"rope_type": "default", "rope_theta": 1000000.0}, 600, "bfloat16", False),
    ("qwen3-d128-g1-tied-fp16", dict(model_type="qwen3", hidden_size=256,
                                     num_attention_heads=4, num_key_value_heads=4,
                                     head_dim=128, tie_word_embeddings=True),
     {"rope_type": "default", "rope_theta": 1000000.0}, 200, "float16", False),
    ("mistral-d128-g4-bf16", dict(model_type="mistral", hidden_size=512,
                                  num_attention_heads=4, num_key_value_heads=1, head_dim=128,
                                  sliding_window=None),
     {"rope_type": "default", "rope_theta": 1000000.0}, 300, "bfloat16", False),
    ("mistral-d64-window-fp16", dict(model_type="mistral", hidden_size=256,  # window >= context
                                     num_attention_heads=4, num_key_value_heads=2,
                                     head_dim=64, sliding_window=2048),
     {"rope_type": "default", "rope_theta": 10000.0}, 1000, "float16", False),
]


def _hf_config(dims: dict, rope: dict):
    base = dict(vocab_size=1000, intermediate_size=768, num_hidden_layers=2,
                max_position_embeddings=2048, rms_norm_eps=1e-5, bos_token_id=None,
                eos_token_id=None, pad_token_id=None)
    dims = dict(dims)
    family = dims.pop("model_type", "llama")
    return transformers.AutoConfig.for_model(family, **{**base, **dims},
                                             rope_parameters=dict(rope))


def _save(tmp_path, dims, rope, dtype, shard, seed=0):
    """A random *ForCausalLM of dims' model_type (LLaMA by default) saved by transformers;
    weights scaled so activations stay O(1) through the layers, norm weights and biases
    random."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(_hf_config(dims, rope))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0, 0.5)
            elif p.ndim == 1:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.normal_(0, 1)
            else:
                p.normal_(0, p.shape[1] ** -0.5)
    dt = getattr(torch, dtype)
    model.to(dt).save_pretrained(tmp_path, max_shard_size="1MB" if shard else "5GB")
    return tmp_path


def _hf_logits(path, dtype, tokens):
    m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    m = m.cuda().eval()
    with torch.no_grad():
        out = m(torch.tensor([tokens], device="cuda")).logits[0].float().cpu().numpy()
    del m
    torch.cuda.empty_cache()
    return out


def _rawgraph_logits(path, prompt, steps):
    ck = checkpoint.load(path)
    model = Model.from_checkpoint(ck, max_batch=1, max_context=len(prompt) + len(steps) + 16,
                                  max_chunk=CHUNK, max_chunk_seqs=1)
    s = new_stream()
    out = []
    for start in range(0, len(prompt), CHUNK):
        piece = prompt[start:start + CHUNK]
        final = start + len(piece) == len(prompt)
        model.prefill([PrefillPiece(0, piece, start, final=final)], s)
    out.append(to_float32(model.pre["logits"][0].get(), ck.config.dtype))
    for tok in steps:
        model.decode([0], [tok], s)
        out.append(to_float32(model.dec["logits"][0].get(), ck.config.dtype))
    model.close()
    # CuPy keeps freed blocks in its pool: give them back for transformers' forward (a
    # 32k-token prompt's attention takes 32 GiB, more than an H100 has left beside them)
    cupy.get_default_memory_pool().free_all_blocks()
    return ck.config, np.stack(out)


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize(("dims", "rope", "prompt_len", "dtype", "shard"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_logits_match_transformers(tmp_path, dims, rope, prompt_len, dtype, shard):
    path = _save(tmp_path, dims, rope, dtype, shard)
    if shard:
        assert (path / checkpoint.INDEX).is_file()
    assert "rope_parameters" in json.loads((path / "config.json").read_text())  # v5 spelling
    rng = np.random.default_rng(1)
    seq = [int(t) for t in rng.integers(0, 1000, prompt_len + DECODE)]
    prompt, steps = seq[:prompt_len], seq[prompt_len:]
    cfg, got = _rawgraph_logits(path, prompt, steps)
    assert cfg.dtype == dtype and cfg.rope_theta == rope["rope_theta"]
    assert cfg.family == dims.get("model_type", "llama")
    ref = _hf_logits(path, "float32", seq)[prompt_len - 1:prompt_len + DECODE]
    own = _hf_logits(path, dtype, seq)[prompt_len - 1:prompt_len + DECODE]
    err, hf_err = _rel(got, ref), _rel(own, ref)
    top1 = float((got.argmax(-1) == ref.argmax(-1)).mean())
    print(f"rawgraph {err:.5f}, transformers {dtype} {hf_err:.5f}, top-1 agreement {top1:.2f}")
    assert err <= 1.5 * hf_err, (err, hf_err)
    # greedy tokens: the same wherever the float32 top two are not a near tie
    top2 = np.sort(ref, -1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 0.02 * np.abs(ref).max(-1)
    assert (got.argmax(-1) == ref.argmax(-1))[clear].all(), (clear, got.argmax(-1))
    # the classic spelling of the same checkpoint reads the same model
    hf = json.loads((path / "config.json").read_text())
    p = hf.pop("rope_parameters")
    hf["rope_theta"] = p.pop("rope_theta")
    hf["rope_scaling"] = None if p["rope_type"] == "default" else p
    hf["torch_dtype"] = hf.pop("dtype")
    (path / "config.json").write_text(json.dumps(hf))
    assert checkpoint.load(path).config == cfg


def test_the_reference_s_sliding_window_matches_transformers():
    # rawgraph's attention has no window (a model whose window is shorter than its context
    # is refused); the NumPy reference follows the family table's window, as transformers'
    # Mistral does, at a context where the window changes the logits
    from rawgraph.model.reference import KVState, forward

    dims = dict(model_type="mistral", hidden_size=256, num_attention_heads=4,
                num_key_value_heads=2, head_dim=64, sliding_window=16)
    hf = transformers.AutoModelForCausalLM.from_config(
        _hf_config(dims, {"rope_type": "default", "rope_theta": 10000.0})).float().eval()
    tokens = [int(t) for t in np.random.default_rng(2).integers(0, 1000, 48)]
    with torch.no_grad():
        want = hf(torch.tensor([tokens])).logits[0].numpy()
    cfg = ModelConfig.from_hf(hf.config.to_dict())
    assert cfg.sliding_window == 16
    w = {k: v.numpy() for k, v in hf.state_dict().items()}  # float32, lm_head untied
    got = forward(cfg, w, np.array(tokens), KVState())
    unwindowed = forward(cfg.replace(sliding_window=None), w, np.array(tokens), KVState())
    assert _rel(got, want) < 1e-4
    assert _rel(unwindowed[20:], want[20:]) > 100 * _rel(got[20:], want[20:])


@pytest.mark.parametrize("rope", [c[2] for c in CASES] + [
    {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 16.0,
     "original_max_position_embeddings": 512, "beta_fast": 16.0, "beta_slow": 2.0,
     "mscale": 1.0, "mscale_all_dim": 0.5, "truncate": False},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
     "original_max_position_embeddings": 1024, "attention_factor": 0.8}],
    ids=lambda r: r["rope_type"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rope_tables_match_transformers(rope, head_dim):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    dims = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                head_dim=head_dim, max_position_embeddings=4096)
    hf = _hf_config(dims, rope)
    kind = rope["rope_type"]
    fn = ROPE_INIT_FUNCTIONS.get(kind, LlamaRotaryEmbedding.compute_default_rope_parameters)
    want, factor = fn(hf, "cpu")
    cfg = ModelConfig.from_hf(hf.to_dict())
    got = inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    # float32 pow and the llama3 blend round in NumPy and torch alike up to an ulp or two
    np.testing.assert_allclose(got, want.numpy(), rtol=4e-7, atol=0)
    assert attention_factor(cfg.rope_scaling) == pytest.approx(factor, rel=1e-12)
