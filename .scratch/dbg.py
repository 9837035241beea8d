import numpy as np
from rawgraph.engine import Engine, Request
from rawgraph.model.config import preset
from rawgraph.model.program import Model, PrefillPiece
from rawgraph.model.reference import float_weights, greedy, forward, KVState
from rawgraph.model.weights import random_weights
from rawgraph.cuda.stream import new_stream
CFG = preset("tiny"); T = random_weights(CFG, 21); w = float_weights(CFG, T)
rng = np.random.default_rng(3)
specs = [(7, 20, 0), (130, 8, 0), (1, 33, 2), (64, 12, 5), (65, 5, 5), (20, 16, 9)]
prompts = [[int(t) for t in rng.integers(0, CFG.vocab, n)] for n, k, a in specs]
def mk(): return Model(CFG, T, max_batch=4, max_context=640, max_chunk=64, max_chunk_seqs=4)
ref = greedy(CFG, w, prompts[0], 20)
lg = forward(CFG, w, np.array(prompts[0] + ref[:3]), KVState())
for i in range(6, 10):
    s = np.sort(lg[i])[::-1]; print("ref step", i, "top2 gap", s[0] - s[1])
print("ref", ref[:8])
s = new_stream(); m = mk()
out = m.prefill([PrefillPiece(0, prompts[0], 0)], s)
for _ in range(7): out += m.decode([0], [out[-1]], s)
print("model alone", out)
for streams in (1, 2):
    for sel in ([0], [0, 1], list(range(6))):
        m = mk(); e = Engine(m, streams=streams, progress=False, graphs=False)
        reqs = [Request(prompts[i], specs[i][1], arrival=specs[i][2]) for i in sel]
        e.run(reqs)
        print("engine eager streams", streams, "reqs", sel, reqs[0].output[:8], [ (i.prefill_tokens, i.decode_rows) for i in e.stats.iters[:4]])
