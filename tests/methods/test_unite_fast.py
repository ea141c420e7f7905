"""UniTE's tensor alignment (vocab/topk.py AlignmentTables, Unite._step) == the per-row host
implementation it replaced (kept below as ``reference_step``), on tiny vocabularies with
duplicate byte strings, several stop ids, control tokens and empty pieces, and on the real
Llama-3 / Qwen2 vocabularies when their tokenizers are cached: the same choices, the same
scores bit for bit and the same |V^u|, over many random distributions full of ties."""

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ensemble_bench.decoding.feeding import text_appender
from ensemble_bench.methods.token_level import log_or_floor
from ensemble_bench.methods.unite import Unite, UniteParams, UniteStats
from ensemble_bench.vocab import VocabView
from ensemble_bench.vocab.fast_topk import block_topk
from ensemble_bench.vocab.topk import (
    Aligned,
    AlignmentTables,
    TopKAligner,
    average_aligned,
    average_rows,
    member_topk,
    union_keys,
)


# ------------------------------------------------------------------ the replaced implementation
def reference_best_stops(logprobs, stop_ids):
    if not stop_ids:
        return [None] * logprobs.shape[0]
    ordered = sorted(stop_ids)
    best = logprobs[:, torch.tensor(ordered)].argmax(dim=-1).tolist()
    return [ordered[k] for k in best]


def reference_token_probs(logprobs, tokens):
    rows = [row for row, row_tokens in enumerate(tokens) for token, _ in row_tokens if token >= 0]
    ids = [token for row_tokens in tokens for token, _ in row_tokens if token >= 0]
    flat = iter(logprobs[torch.tensor(rows, dtype=torch.long), torch.tensor(ids, dtype=torch.long)].exp().tolist())
    return [[next(flat) if token >= 0 else 0.0 for token, _ in row_tokens] for row_tokens in tokens]


def reference_step(aligners, weights, emitter, k, logprobs, targets):
    """Unite._step before the tensor alignment: keys and rules per row on the host.
    Returns (choices, target log-probs or None, summed |V^u| of generation rows)."""
    tops = [block_topk(lp, min(k, lp.shape[-1])) for lp in logprobs]
    top_ids = [ids.tolist() for _, ids in tops]
    top_probs = [values.exp().tolist() for values, _ in tops]
    best_stops = [reference_best_stops(lp, a.stop_ids) for lp, a in zip(logprobs, aligners)]
    plans, union_size = [], 0
    for row in range(len(top_ids[0])):
        topks = [member_topk(a, ids[row], dict(zip(ids[row], probs[row])))
                 for a, ids, probs in zip(aligners, top_ids, top_probs)]
        keys = union_keys(topks)
        if targets is None:
            union_size += len(keys)
        else:
            target_key = aligners[emitter].key(targets[row])
            if target_key is not None and target_key not in keys:
                keys.append(target_key)
        plans.append((keys, [[a.aligned_token(key, topk, stops[row]) for key in keys]
                             for a, topk, stops in zip(aligners, topks, best_stops)]))
    probs = [reference_token_probs(lp, [tokens[index] for _, tokens in plans]) for index, lp in enumerate(logprobs)]
    choices, scored = [], []
    for row, (_, tokens) in enumerate(plans):
        aligned = [[Aligned(token, prob, rule) for (token, rule), prob in zip(member_tokens, member_probs[row])]
                   for member_tokens, member_probs in zip(tokens, probs)]
        averaged = average_aligned(aligned, weights)
        emitted = aligned[emitter]
        best = max((j for j, a in enumerate(emitted) if a.token >= 0), key=lambda j: averaged[j])
        choices.append(emitted[best].token)
        if targets is not None:
            scored.append(log_or_floor(sum(v for a, v in zip(emitted, averaged) if a.token == targets[row])))
    return choices, (scored if targets is not None else None), union_size


def bare_unite(aligners, k, emitter, weights):
    """A Unite with only what ``_step`` reads (no members needed)."""
    method = Unite.__new__(Unite)
    method.params = UniteParams(k=k)
    method.lead, method.weights, method.aligners = emitter, list(weights), list(aligners)
    method.tables = AlignmentTables(method.aligners)
    method.stats = UniteStats()
    method._stops = {}
    method.core = None  # no CoRE (methods/core.py)
    return method


def assert_same_as_reference(method, logprobs, targets=None):
    try:
        expected = reference_step(method.aligners, method.weights, method.lead, method.params.k, logprobs, targets)
    except ValueError:  # no key of V^u that the emitter can emit, in some row
        with pytest.raises(ValueError, match="no token for any key"):
            method._step(logprobs, targets)
        return
    before = method.stats.union_sizes
    step = method._step(logprobs, targets)
    assert step.choices == expected[0]
    assert step.target_logprobs == expected[1]  # bit for bit
    assert method.stats.union_sizes - before == expected[2]


# ------------------------------------------------------------------ tiny vocabularies
ALPHABET = b"ab c"


def greedy_encoder(pieces, special_ids):
    """Longest-prefix tokenisation over the ordinary pieces (lowest id per byte string)."""
    lookup = {}
    for token_id, piece in enumerate(pieces):
        if piece and token_id not in special_ids:
            lookup.setdefault(piece, token_id)

    def encode(data: bytes) -> list[int]:
        ids = []
        while data:
            size = max(n for n in range(1, len(data) + 1) if data[:n] in lookup)
            ids.append(lookup[data[:size]])
            data = data[size:]
        return ids
    return encode


def tiny_aligner(rng: random.Random, size: int, stops: int, specials: list[bytes]) -> TopKAligner:
    """Every single byte of ALPHABET, random pieces with repeats (duplicate byte strings), an empty
    and a missing piece, ``stops`` stop ids (with ordinary-looking text) and the control tokens."""
    pieces = [bytes([b]) for b in ALPHABET]
    while len(pieces) < size:
        pieces.append(rng.choice(pieces) if rng.random() < 0.2 else
                      bytes(rng.choice(ALPHABET) for _ in range(rng.randint(1, 3))))
    pieces += [b"", None]
    stop_ids = []
    for n in range(stops):
        stop_ids.append(len(pieces))
        pieces.append(b"</s>" if n == 0 else rng.choice(pieces[:len(ALPHABET)]))
    special_ids = set(stop_ids)
    for text in specials:
        special_ids.add(len(pieces))
        pieces.append(text)
    order = list(range(len(pieces)))
    rng.shuffle(order)  # stop ids, control tokens and duplicates anywhere in the id space
    shuffled = [pieces[i] for i in order]
    new_id = {old: new for new, old in enumerate(order)}
    stop_set = frozenset(new_id[i] for i in stop_ids)
    specials_set = frozenset(new_id[i] for i in special_ids)
    view = VocabView(tuple(shuffled), specials_set, "byte-level")
    return TopKAligner(view, stop_set, greedy_encoder(view.pieces, specials_set))


def random_logprobs(gen: torch.Generator, rows: int, size: int) -> torch.Tensor:
    """Distributions with many exact ties (logits on a few levels), some peaked, some with
    -inf entries (a member may then have no mass on V^u)."""
    levels = int(torch.randint(1, 5, (1,), generator=gen))
    logits = torch.randint(0, levels, (rows, size), generator=gen).float()
    logits *= torch.rand((rows, 1), generator=gen) * 8
    blocked = torch.rand((rows, size), generator=gen) < 0.3
    blocked[:, 0] = False
    logits[blocked & (torch.rand((rows, 1), generator=gen) < 0.3)] = float("-inf")
    return logits.log_softmax(dim=-1)


@pytest.mark.parametrize("seed", range(12))
def test_tensor_alignment_equals_reference_on_tiny_vocabularies(seed):
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    members = 2 + seed % 2
    aligners = [tiny_aligner(rng, rng.randint(8, 40), stops=rng.choice([0, 1, 2]) if m else rng.choice([1, 3]),
                             specials=rng.sample([b"<s>", b"<x>", b"<y>"], rng.randint(0, 2)))
                for m in range(members)]
    for _ in range(15):
        k = rng.choice([1, 2, 3, 10, 60])
        weights = rng.choice([[1.0 / members] * members, [rng.uniform(0.1, 2) for _ in range(members)]])
        method = bare_unite(aligners, k, rng.randrange(members), weights)
        rows = rng.choice([1, 5, 17])
        logprobs = [random_logprobs(gen, rows, a.view.size) for a in aligners]
        assert_same_as_reference(method, logprobs)
        emitter_size = aligners[method.lead].view.size
        targets = [rng.randrange(emitter_size) for _ in range(rows)]
        assert_same_as_reference(method, logprobs, targets)


def test_rule3_tokenises_each_missing_key_once():
    rng, gen = random.Random(7), torch.Generator().manual_seed(7)
    aligners = [tiny_aligner(rng, 30, 1, []), tiny_aligner(rng, 30, 1, [])]
    calls = []
    for aligner in aligners:
        encode = aligner.encode_bytes
        aligner.encode_bytes = lambda data, encode=encode: calls.append(data) or encode(data)
    method = bare_unite(aligners, 10, 0, [0.5, 0.5])
    for _ in range(20):
        assert_same_as_reference(method, [random_logprobs(gen, 4, a.view.size) for a in aligners])
    assert len(calls) == len(set(calls)) > 0


def test_average_rows_is_the_reference_average_bit_for_bit():
    rng = np.random.default_rng(3)
    for _ in range(200):
        members, columns = rng.integers(1, 4), rng.integers(1, 30)
        probs = rng.random((members, 6, columns)).astype(np.float32).astype(np.float64)
        probs[rng.random(probs.shape) < 0.3] = 0.0
        probs *= rng.choice([1e-30, 1e-8, 1.0], size=(members, 6, 1))
        weights = list(rng.random(members) + 0.01)
        fast = average_rows(probs, weights)
        for row in range(6):
            aligned = [[Aligned(0, float(p), 1) for p in probs[m, row]] for m in range(members)]
            assert fast[row].tolist() == average_aligned(aligned, weights)


# ------------------------------------------------------------------ the real Llama-3 / Qwen2 vocabularies
def cached_real_aligner(name: str) -> TopKAligner:
    from ensemble_bench.cache import cache_dir
    from ensemble_bench.members.local import stop_ids_of
    from ensemble_bench.members.vocab_files import load_vocab_tokenizer
    from ensemble_bench.vocab.bytes_view import build_vocab_view

    if not (cache_dir() / "tokenizers" / f"vocab-{name}").exists():
        pytest.skip(f"the {name} tokenizer is not cached")
    tokenizer = load_vocab_tokenizer(name)
    view = build_vocab_view(tokenizer, 151936 if name == "qwen2" else len(tokenizer))
    member = SimpleNamespace(vocab=view, encode=lambda text, add_special_tokens=False: tokenizer.encode(
        text, add_special_tokens=add_special_tokens))
    return TopKAligner(view, stop_ids_of(tokenizer, None, view), text_appender(member, 4).encode_bytes)


@pytest.mark.slow
def test_tensor_alignment_equals_reference_on_llama3_and_qwen2():
    aligners = [cached_real_aligner("llama3"), cached_real_aligner("qwen2")]
    gen, rng = torch.Generator().manual_seed(0), random.Random(0)
    sizes = [a.view.size for a in aligners]
    for emitter in (0, 1):
        method = bare_unite(aligners, 10, emitter, [0.5, 0.5])
        for scale in (1.0, 30.0, 300.0):  # flat to peaked
            logprobs = [(torch.randn((8, size), generator=gen) * scale).log_softmax(dim=-1) for size in sizes]
            for lp, aligner in zip(logprobs, aligners):  # stop ids and duplicate byte strings near the top
                lp[:3, sorted(aligner.stop_ids)] = lp[:3].max(dim=-1, keepdim=True).values
            assert_same_as_reference(method, logprobs)
            assert_same_as_reference(method, logprobs, [rng.randrange(sizes[emitter]) for _ in range(8)])


def test_bf16_and_mixed_precision_members_and_an_empty_batch():
    rng, gen = random.Random(1), torch.Generator().manual_seed(1)
    aligners = [tiny_aligner(rng, 30, 1, [b"<s>"]), tiny_aligner(rng, 25, 2, [])]
    method = bare_unite(aligners, 3, 1, [0.3, 0.7])
    for _ in range(30):
        logprobs = [random_logprobs(gen, 4, a.view.size).to(torch.bfloat16) for a in aligners]
        assert_same_as_reference(method, logprobs)
        assert_same_as_reference(method, [logprobs[0].float(), logprobs[1]], [1, 2, 3, 4])
    empty = [torch.zeros((0, a.view.size)) for a in aligners]
    assert method._step(empty, None).choices == [] and method._step(empty, []).target_logprobs == []
