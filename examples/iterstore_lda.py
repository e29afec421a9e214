"""Topic modelling (collapsed Gibbs LDA) with the parameter server: documents' and words' topic
counts and the summation row are rows updated by +1/-1 deltas; each worker owns its documents'
tokens and their sampled topics, which a virtual gather leaves alone.

Run: ``.venv/bin/python examples/iterstore_lda.py`` (after ``make develop``): 200 synthetic
documents drawn from 8 planted topics; ``--docs .data/iter/manpages-tokens.txt`` for Debian's
man pages (``make iter-data``; ``--max-docs`` bounds how many).
"""

import argparse
import math

import numpy as np

import embstore

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--docs", help="docname<TAB>tokens per line ('#' comments)")
parser.add_argument("--max-docs", type=int, default=200)
parser.add_argument("--topics", type=int, default=8)
parser.add_argument("--iters", type=int, default=10)
args = parser.parse_args()
K, ALPHA, BETA, WORKERS = args.topics, 0.1, 0.01, 2

rng = np.random.default_rng(3)
if args.docs:
    lines = [ln for ln in open(args.docs, encoding="utf-8") if not ln.startswith("#")]
    texts = [ln.split("\t", 1)[1].split() for ln in lines[: args.max_docs]]
    words, counts = np.unique(np.concatenate([np.array(t) for t in texts]), return_counts=True)
    vocab = {w: i for i, w in enumerate(words[counts >= 5])}
    docs = [np.array([vocab[t] for t in text if t in vocab]) for text in texts]
else:  # 8 planted topics of 25 words each, 2 topics a document
    docs = []
    for _ in range(200):
        t = rng.choice(8, 2, replace=False)
        docs.append(rng.integers(0, 25, 40) + 25 * rng.choice(t, 40))
    vocab = range(200)
V = len(vocab)

store = embstore.Store()
for name in ("doc", "word", "sum"):
    store.create_table(name, K, optimizer=embstore.Delta(), initializer=embstore.Zeros())
ps = store.ps(["doc", "word", "sum"], workers=WORKERS)
z = [rng.integers(0, K, len(d)) for d in docs]  # each token's topic
for d, (words_d, z_d) in enumerate(zip(docs, z, strict=True)):  # the initial counts
    store["doc"].apply_gradients([d], np.bincount(z_d, minlength=K)[None].astype(np.float32))
    store["word"].apply_gradients(words_d, np.eye(K, dtype=np.float32)[z_d])
    store["sum"].apply_gradients([0], np.bincount(z_d, minlength=K)[None].astype(np.float32))


def sweep(w):
    """One Gibbs sweep over worker w's documents; own updates are seen at once."""
    r = np.random.default_rng((w.global_id, w.clock_now))
    for d in range(w.id, len(docs), WORKERS):
        nd = w.read("doc", [d])[0]  # as of the last clock, plus this worker's own updates
        for i, word in enumerate(docs[d]):
            nw, ns = w.read("word", [word])[0], w.read("sum", [0])[0]
            old = z[d][i]
            own = np.eye(K, dtype=np.float32)[old]
            p = (nd - own + ALPHA) * (np.maximum(nw - own, 0) + BETA)
            p /= np.maximum(ns - own, 0) + V * BETA
            new = min(int(np.searchsorted(np.cumsum(p), r.random() * p.sum())), K - 1)
            delta = np.zeros((1, K), np.float32)
            if new != old and not w.in_virtual_gather:
                delta[0, old], delta[0, new] = -1, 1
                nd += delta[0]
                z[d][i] = new
            w.update("word", [word], delta)
            w.update("sum", [0], delta)
        w.update("doc", [d], (nd - w.read("doc", [d])[0])[None])
    w.clock()


def log_likelihood():
    nw = store["word"].lookup(np.arange(V))
    ns = store["sum"].lookup([0])[0]
    ll = sum(math.lgamma(V * BETA) - math.lgamma(n + V * BETA) for n in ns)
    return ll + sum(math.lgamma(n + BETA) - math.lgamma(BETA) for n in nw.ravel() if n)


with ps.gather(virtual=True) as g:  # reads zeros, writes nothing, leaves z alone
    for w in range(WORKERS):
        sweep(g.worker(w))
print("plan:", ps.finish_gather())
print(f"{len(docs)} documents, {V} words, {sum(map(len, docs))} tokens, K {K}")
print(f"iteration 0: log p(w|z) {log_likelihood():.1f}")
for it in range(1, args.iters + 1):
    ps.run(sweep, clocks=1)
    if it % 5 == 0 or it == args.iters:
        print(f"iteration {it}: log p(w|z) {log_likelihood():.1f}")
s = ps.stats()
print(f"rows fetched one at a time: {s['fetches']}, prefetched: {s['prefetch_rows']}")
