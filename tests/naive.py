"""The naive references that the fast paths are checked against ("fast == slow"), in one place.

Each one works a request at a time: every forward recomputed from the full sequence, no KV cache,
no batching, vocabularies scanned with Python loops and dicts. The tests compare the methods' cached,
batched outputs with these, exactly (or within float tolerance where they say so).
"""

import math

import torch
import torch.nn.functional as F

from ensemble_bench.decoding.feeding import member_continuation, text_appender, text_lookup
from ensemble_bench.decoding.stopping import cut_at_until
from ensemble_bench.methods.span_level import text_of
from ensemble_bench.vocab.append import TextAppender, single_byte_ids
from ensemble_bench.vocab.relative import anchor_ids
from ensemble_bench.vocab.retokenize import CanonicalTail, continuation_encoder
from ensemble_bench.vocab.topk import TopKAligner, average_aligned, member_topk, union_keys
from ensemble_bench.vocab.union import STOP_KEY


# ------------------------------------------------------------------ shared pieces
def next_logprobs(model, ids):
    """The log-probabilities of the token after ``ids``, from a forward over the whole sequence."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1].float().log_softmax(-1)


def appender_by_hand(member, window):
    """A TextAppender over the member's text tokens (lowest id per byte string), built from its vocabulary."""
    pieces, special = member.vocab.pieces, member.vocab.special_ids
    lowest = {p: i for i, p in reversed(list(enumerate(pieces))) if p and i not in special and i not in member.stop_ids}
    return TextAppender(pieces, lowest, single_byte_ids(pieces, special), member_continuation(member), window)


def feed_chosen(members, appenders, seqs, emitter, token) -> None:
    """The emitter appends its token; every other member takes its bytes (re-tokenising a window)."""
    data = members[emitter].vocab.pieces[token]
    for i in range(len(members)):
        if i == emitter:
            seqs[i].append(token)
        else:
            plan = appenders[i].plan(seqs[i], data)
            seqs[i] = seqs[i][:len(seqs[i]) - plan.drop] + list(plan.ids)


# ------------------------------------------------------------------ GaC (Eq. 3/5); PackLLM's union path
def naive_gac(members, models, request, weights, gate=None, threshold=None, window=4):
    """Eq. 3/5 one request at a time, every forward recomputed from scratch, union by a dict."""
    index, maps = {}, []
    for m in members:
        mapping = {}
        for token_id, piece in enumerate(m.vocab.pieces):
            if token_id in m.stop_ids:
                key = STOP_KEY + piece
            elif piece and token_id not in m.vocab.special_ids:
                key = piece
            else:
                continue
            mapping[token_id] = index.setdefault(key, len(index))
        maps.append(mapping)
    entries = sorted(index, key=index.get)
    appenders = [appender_by_hand(m, window) for m in members]
    seqs = [m.render(request.prompt) for m in members]
    pending = [[] for _ in members]
    text = b""
    reference = gate if gate is not None else 0
    lowest = {}
    for token_id, union_id in maps[reference].items():
        lowest.setdefault(union_id, token_id)
    reference_ids = []

    def render():  # the reference member's decode when it has every piece as a token
        if reference_ids is not None:
            return members[reference].decode(reference_ids)
        return text.decode("utf-8", errors="replace")
    for _ in range(1, request.max_new_tokens + 1):
        def probs(k):
            return next_logprobs(models[k], seqs[k]).exp()
        gate_p = probs(gate) if gate is not None else None
        if gate is not None and float(gate_p.max()) > threshold:  # Eq. 5, gate alone
            token = int(gate_p.argmax())
            if token in members[gate].stop_ids:
                break
            data = members[gate].vocab.pieces[token]
            seqs[gate].append(token)
            chosen_reference = token
            for k in range(len(members)):
                if k != gate:
                    pending[k].append(data)
        else:
            for k in range(len(members)):  # catch up piece by piece, then Eq. 3
                for piece in pending[k]:
                    plan = appenders[k].plan(seqs[k], piece)
                    seqs[k] = seqs[k][:len(seqs[k]) - plan.drop] + list(plan.ids)
                pending[k] = []
            mixed = [0.0] * len(entries)
            for k, mapping in enumerate(maps):
                p = probs(k)
                for token_id, union_id in mapping.items():
                    mixed[union_id] += weights[k] * float(p[token_id]) / sum(weights)
            best = max(range(len(entries)), key=lambda u: (mixed[u], -u))
            if entries[best].startswith(STOP_KEY):
                break
            data = entries[best]
            chosen_reference = lowest.get(best, -1)
            for k in range(len(members)):
                plan = appenders[k].plan(seqs[k], data)
                seqs[k] = seqs[k][:len(seqs[k]) - plan.drop] + list(plan.ids)
        text += data
        if reference_ids is not None:
            reference_ids = reference_ids + [chosen_reference] if chosen_reference >= 0 else None
        if any(u in render() for u in request.until):
            break
    return render()


# ------------------------------------------------------------------ PackLLM's weights and MinED map
def naive_weights(members, models, request, params):
    """The prompt's lambda and top-1 expert from full forwards, one member at a time (ends and segments by
    dicts; opt with mined alignment: the logit fusion's cross-entropy on the expert's tokens)."""
    cumulative, totals, readings = [], [], []
    for member, model in zip(members, models):
        ids = member.render(request.prompt)
        ids = ids[1:] if ids and ids[0] == member.prefix_token_id else ids
        context, ids = (ids[:1], ids[1:]) if params.score_from == "second_token" else ([member.prefix_token_id], ids)
        with torch.no_grad():
            logprobs = model(torch.tensor([context + ids])).logits[0].float().log_softmax(-1)
        running, offset, total = {}, -1 if member.vocab.strips_leading_space else 0, 0.0
        for position, token in enumerate(ids):
            total += float(logprobs[position, token])
            offset += len(member.vocab.pieces[token] or b"")
            running[max(offset, 0)] = total
        cumulative.append(running)
        totals.append((total, len(ids)))
        readings.append((context, ids))
    log_ppl = [-total / count for total, count in totals]
    expert = min(range(2), key=lambda k: (log_ppl[k], k))
    if params.alignment == "mined":
        carried = naive_carried(members, models, readings[expert], expert, params)
        labels = readings[expert][1]
        if params.ppl_reading == "expert_tokens":
            log_ppl = [-float(c.log_softmax(-1)[torch.arange(len(labels)), torch.tensor(labels)].mean())
                       for c in carried]
    first, second = sorted(range(2), key=lambda k: (log_ppl[k], k))
    if params.variant == "sim":
        exp = [math.exp(-x / params.tau) for x in log_ppl]
        return [e / sum(exp) for e in exp], expert
    if params.alignment == "mined":
        losses = naive_fused_losses(carried, labels, first, params.grid)
    else:
        cuts = sorted(set(cumulative[0]).intersection(*cumulative[1:]))
        bounds = list(zip([None] + cuts[:-1], cuts))
        segs = [[run[c] - (run[p] if p is not None else 0.0) for p, c in bounds] for run in cumulative]
        losses = {s: -sum(math.log(s / params.grid * math.exp(x) + (1 - s / params.grid) * math.exp(y))
                          for x, y in zip(segs[first], segs[second])) for s in range(params.grid + 1)}
    best = min(range(params.grid, -1, -1), key=lambda s: losses[s])
    weights = [0.0, 0.0]
    weights[first], weights[second] = best / params.grid, 1 - best / params.grid
    return weights, expert


def naive_carried(members, models, expert_reading, expert, params):
    """Each member's log-probs along the expert's prompt tokens, on the expert's vocabulary ([member][pos, x]):
    the other member reads the MinED images of the expert's tokens (its prefix token first unless it scores
    from the second token), its log-probs taken at the MinED images (-inf where none)."""
    context, labels = expert_reading
    carried = []
    for k, (member, model) in enumerate(zip(members, models)):
        mapping = {x: x for x in range(members[expert].vocab.size)} if k == expert else \
            naive_map(members[expert], member)
        inputs = [mapping.get(t, 0) for t in context + labels[:-1]]
        if params.score_from == "prefix" and k != expert:
            inputs = [member.prefix_token_id] + inputs[1:]
        with torch.no_grad():
            logprobs = model(torch.tensor([inputs])).logits[0].float().log_softmax(-1)
        columns = [[float(row[mapping[x]]) if x in mapping else -math.inf for x in range(members[expert].vocab.size)]
                   for row in logprobs[len(inputs) - len(labels):]]
        carried.append(torch.tensor(columns))
    return carried


def naive_fused_losses(carried, labels, expert, grid):
    """Cross-entropy of softmax(a s_expert + (1-a) s_other) on the expert's prompt tokens, a = s / grid."""
    other = 1 - expert
    losses = {}
    for s in range(grid + 1):
        a = s / grid
        fused = (a * carried[expert] if a > 0 else 0) + ((1 - a) * carried[other] if a < 1 else 0)
        losses[s] = -float(torch.log_softmax(fused, -1)[torch.arange(len(labels)), torch.tensor(labels)].sum())
    return losses


def levenshtein(a: bytes, b: bytes) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
    return row[-1]


def naive_map(reference, member) -> dict[int, int]:
    """Reference id -> member id: same role (stop, other special, text), exact bytes, else least edit distance."""
    def role(m, i):
        return "stop" if i in m.stop_ids else "special" if i in m.vocab.special_ids else "text"
    found = {}
    for i, piece in enumerate(reference.vocab.pieces):
        if piece is None:
            continue
        same = [j for j, p in enumerate(member.vocab.pieces) if p is not None and role(member, j) == role(reference, i)]
        if same:
            found[i] = min(same, key=lambda j: (member.vocab.pieces[j] != piece,
                                                levenshtein(piece, member.vocab.pieces[j]), j))
    return found


def naive_mined(members, models, request, weights, reference, window=4):
    """Eq. 3 on the top-1 expert's vocabulary, one request at a time, full forwards, maps as dicts."""
    ref = members[reference]
    maps = [None if k == reference else naive_map(ref, m) for k, m in enumerate(members)]
    appenders = [text_appender(m, window) for m in members]
    writer_ids = text_lookup(members[0])
    seqs = [m.render(request.prompt) for m in members]
    text, writer = b"", []
    for _ in range(request.max_new_tokens):
        logprobs = []
        for model, seq in zip(models, seqs):
            logprobs.append(next_logprobs(model, seq).tolist())
        def fused(x, logprobs=logprobs):
            total = 0.0
            for k, lp in enumerate(logprobs):
                if weights[k] > 0:
                    y = x if k == reference else maps[k].get(x)
                    total += weights[k] * lp[y] if y is not None else -math.inf
            return total
        allowed = [x for x, p in enumerate(ref.vocab.pieces)
                   if x in ref.stop_ids or (p is not None and x not in ref.vocab.special_ids)]
        token = max(allowed, key=lambda x: (fused(x), -x))
        if token in ref.stop_ids:
            break
        data = ref.vocab.pieces[token]
        for k, appender in enumerate(appenders):
            if k == reference:
                seqs[k].append(token)
            else:
                plan = appender.plan(seqs[k], data)
                seqs[k] = seqs[k][:len(seqs[k]) - plan.drop] + list(plan.ids)
        text += data
        if writer is not None:
            own = token if reference == 0 else writer_ids.get(data)
            writer = writer + [own] if own is not None else None
        rendered = members[0].decode(writer) if writer is not None else text.decode("utf-8", errors="replace")
        if any(u in rendered for u in request.until):
            break
    return members[0].decode(writer) if writer is not None else text.decode("utf-8", errors="replace")


# ------------------------------------------------------------------ UniTE (Algorithm 1)
def naive_unite(members, models, request, k, primary, window=4):
    """Algorithm 1 one request at a time, every forward recomputed from scratch."""
    appenders = [text_appender(m, window) for m in members]
    aligners_ = [TopKAligner(m.vocab, m.stop_ids, ap.encode_bytes) for m, ap in zip(members, appenders)]
    seqs = [m.render(request.prompt) for m in members]
    emitted: list[int] = []
    for _ in range(request.max_new_tokens):
        probs = []
        for model, seq in zip(models, seqs):
            probs.append(next_logprobs(model, seq).exp())
        tops = [member_topk(al, p.topk(k).indices.tolist(), p) for al, p in zip(aligners_, probs)]
        keys = union_keys(tops)
        aligned = [[al.align(key, p, top) for key in keys] for al, p, top in zip(aligners_, probs, tops)]
        averaged = average_aligned(aligned, [1.0] * len(members))
        best = max((j for j in range(len(keys)) if aligned[primary][j].token >= 0), key=lambda j: averaged[j])
        token = aligned[primary][best].token
        if token in members[primary].stop_ids:
            break
        emitted.append(token)
        feed_chosen(members, appenders, seqs, primary, token)
        if any(u in members[primary].decode(emitted) for u in request.until):
            break
    return cut_at_until(members[primary].decode(emitted), request.until)


# ------------------------------------------------------------------ DeePEn, dense (Eq. 2, 4, 5, 7)
def dense_relative(embeddings: torch.Tensor, anchors: list[int]) -> torch.Tensor:
    """R^ for every id at once, by F.cosine_similarity (Eq. 2) and a row softmax (Eq. 4)."""
    embeddings = embeddings.float()
    cosine = F.cosine_similarity(embeddings[:, None, :], embeddings[anchors][None, :, :], dim=-1)
    return cosine.softmax(dim=-1)


def dense_argmax(dense, probs, supports, weights, main, eta, steps) -> int:
    """The dense transform of one row: Eq. 5 on the supports, T steps of Eq. 7, the argmax."""
    truncated = []
    for p, ids in zip(probs, supports):
        kept = torch.zeros_like(p)
        kept[ids] = p[ids]
        truncated.append(kept)
    target = sum(w * (p @ rel) for w, p, rel in zip(weights, truncated, dense))
    p = truncated[main].clone()
    for _ in range(steps):
        p[supports[main]] += eta * (dense[main][supports[main]] @ (target / (p @ dense[main])))
    return int(supports[main][p[supports[main]].argmax()])


def naive_deepen(members, models, request, support, main, eta=0.15, steps=5, window=4):
    anchors = anchor_ids([m.vocab for m in members])
    dense = [dense_relative(m.input_embeddings(), a) for m, a in zip(members, anchors)]
    valid = [sorted(set(m.vocab.text_ids()) | set(m.stop_ids)) for m in members]
    appenders = [text_appender(m, window) for m in members]
    seqs = [m.render(request.prompt) for m in members]
    emitted: list[int] = []
    for _ in range(request.max_new_tokens):
        probs, supports = [], []
        for model, seq, ids in zip(models, seqs, valid):
            p = next_logprobs(model, seq).exp()
            keep = torch.tensor(ids)
            if support is not None:
                keep = keep[p[keep].topk(min(support, len(ids))).indices]
            truncated = torch.zeros_like(p)
            truncated[keep] = p[keep]
            probs.append(truncated)
            supports.append(keep)
        target = sum(pr @ rel for pr, rel in zip(probs, dense)) / len(members)  # Eq. 5, Avg
        p = probs[main].clone()
        for _ in range(steps):  # Eq. 7 on the main model's support only
            ratio = target / (p @ dense[main])
            p[supports[main]] += eta * (dense[main][supports[main]] @ ratio)
        token = int(supports[main][p[supports[main]].argmax()])
        if token in members[main].stop_ids:
            break
        emitted.append(token)
        feed_chosen(members, appenders, seqs, main, token)
        if any(u in members[main].decode(emitted) for u in request.until):
            break
    return cut_at_until(members[main].decode(emitted), request.until)


# ------------------------------------------------------------------ CharED
def naive_chared(members, models, request, weights, window=4):
    """CharED one request at a time: every forward from scratch, every marginal by a scan of the vocabulary."""
    appenders = [appender_by_hand(m, window) for m in members]
    seqs = [m.render(request.prompt) for m in members]
    text, writer_ids, count = b"", [], 0

    def render():
        if writer_ids is not None:
            return members[0].decode(writer_ids)
        out = text.decode("utf-8", errors="replace")
        return out[1:] if members[0].vocab.strips_leading_space and out.startswith(" ") else out
    while count < request.max_new_tokens:
        probs = []
        for model, seq in zip(models, seqs):
            probs.append(next_logprobs(model, seq).exp().tolist())
        piece = b""
        while True:
            q = {}
            for member, p, w in zip(members, probs, weights):
                tokens = [(member.vocab.pieces[i], p[i]) for i in range(len(p)) if member.vocab.pieces[i] is not None
                          and i not in member.vocab.special_ids and i not in member.stop_ids]
                inside = [(t, x) for t, x in tokens if t.startswith(piece)]
                stop = sum(p[i] for i in member.stop_ids) if not piece else 0.0
                z = sum(x for _, x in inside) + stop
                if z == 0:
                    q[-1] = q.get(-1, 0.0) + (w if piece else 0.0)
                    continue
                q[-1] = q.get(-1, 0.0) + w * (stop if not piece else sum(x for t, x in inside if t == piece)) / z
                for t, x in inside:
                    if len(t) > len(piece):
                        q[t[len(piece)]] = q.get(t[len(piece)], 0.0) + w * x / z
            best = max(sorted(q), key=lambda option: q[option])  # ties: end (-1), then the lowest byte
            if best == -1:
                break
            piece += bytes([best])
        if not piece:
            break
        count += 1
        text += piece
        lowest = appenders[0].by_bytes.get(piece)
        writer_ids = writer_ids + [lowest] if writer_ids is not None and lowest is not None else None
        for k in range(len(members)):
            plan = appenders[k].plan(seqs[k], piece)
            seqs[k] = seqs[k][:len(seqs[k]) - plan.drop] + list(plan.ids)
        if any(u in render() for u in request.until):
            break
    return render(), count


# ------------------------------------------------------------------ Byte-level exact ensembling
WHITE = b" \t\n\r\x0b\x0c"


def naive_probe(first: int) -> bytes:
    """The probe character of a first byte's class (vocab/lookahead.py): letters, digits, the rest."""
    if first >= 0x80 or bytes([first]).isalpha():
        return b"a"
    return b"0" if bytes([first]).isdigit() else b"!"


def naive_trunk(member, tail, text: bytes, first: int | None):
    """The trunk of the branch at the end of ``text`` for tokens starting with byte ``first`` (None:
    the end of the text), from scratch: c(text) unless text ends with whitespace and ``first`` is no
    whitespace; then the ids of encode(text + probe) that spell exactly ``text`` (None: none do)."""
    ids, _ = tail.canonical(text)
    if not text or text[-1] not in WHITE or first is None or first in WHITE:
        return tuple(ids)
    probed, _ = tail.canonical(text + naive_probe(first))
    spelled = 0
    for count, token in enumerate(probed + [None]):
        if spelled == len(text):
            return tuple(probed[:count])
        if token is None or spelled > len(text):
            return None
        spelled += len(member.vocab.pieces[token])
    return None


def naive_next_byte(member, model, prompt, tail, x):
    """M(. | x) of one member: every j and every trunk the tokens after x[:j] can have (one per
    first byte, naive_trunk), re-encoded from scratch, one full forward per trunk, a Python loop
    over the vocabulary."""
    terms = []
    for j in range(len(x) + 1):
        suffix = x[j:]
        if tail.canonical(x[:j])[1] or not any(p and p.startswith(suffix) for p in member.vocab.pieces):
            continue
        trunks: dict = {}
        for first in ([x[j]] if j < len(x) else list(range(256)) + [None]):
            trunks.setdefault(naive_trunk(member, tail, x[:j], first), []).append(first)
        for ids, firsts in trunks.items():
            if ids is None:
                continue
            with torch.no_grad():
                logprobs = model(torch.tensor([prompt + list(ids)])).logits[0].double().log_softmax(-1)
            trunk = sum(float(logprobs[len(prompt) - 1 + q, token]) for q, token in enumerate(ids))
            probs = logprobs[-1].exp().tolist()
            mass = [0.0] * 257
            for token, piece in enumerate(member.vocab.pieces):
                if piece and token not in member.vocab.special_ids and token not in member.stop_ids \
                        and len(piece) > len(suffix) and piece.startswith(suffix) \
                        and (j < len(x) or piece[0] in firsts):
                    mass[piece[len(suffix)]] += probs[token]
            if j == len(x) and None in firsts:
                mass[256] = sum(probs[s] for s in member.stop_ids)
            terms.append((trunk, mass))
    top = max(t for t, _ in terms)
    total = [sum(math.exp(t - top) * m[b] for t, m in terms) for b in range(257)]
    return [v / sum(total) for v in total]


def naive_byte_level(members, models, request, weights, main=0, official=False):
    """Greedy byte-level decoding from scratch; ``official`` (prompt_rule official): every member
    reads its prefix token (BOS) alone, and the prompt's bytes start the covered text x; the budget
    counts the main member's canonical tokens past the most the prompt's prefixes had."""
    tails = [CanonicalTail.from_view(m.vocab,
                                     continuation_encoder(lambda t, m=m: m.encode(t, add_special_tokens=False)))
             for m in members]
    prompts = [m.render(request.prompt) for m in members]
    x, budget = b"", 0
    if official:
        prompts, x = [[m.prefix_token_id] for m in members], request.prompt.text.encode()
        budget = max(len(tails[main].canonical(x[:n])[0]) for n in range(len(x) + 1))
    start, base = len(x), budget
    while True:
        dists = [naive_next_byte(m, model, p, tail, x) for m, model, p, tail in zip(members, models, prompts, tails)]
        mixed = [sum(w * d[b] for w, d in zip(weights, dists)) / sum(weights) for b in range(257)]
        byte = max(range(257), key=lambda b: (mixed[b], -b))
        if byte == 256:
            break
        x += bytes([byte])
        budget = max(budget, len(tails[main].canonical(x)[0]))
        text = x[start:].decode("utf-8", "replace")
        if any(u in text for u in request.until) or budget - base >= request.max_new_tokens:
            break
    text = x[start:].decode("utf-8", "replace")
    return text[1:] if members[main].vocab.strips_leading_space and text.startswith(" ") else text


def naive_byte_score(members, models, context, continuation, weights, bos=False):
    """log q(continuation | context) and is_greedy: for every byte, every member's M(. | x) from
    scratch (naive_next_byte), the weighted average, the forced byte's log-probability. ``bos``: every
    context starts with the member's prefix token (prompt_rule official)."""
    tails = [CanonicalTail.from_view(m.vocab, continuation_encoder(
        lambda t, m=m: m.encode(t, add_special_tokens=False))) for m in members]
    spaces = len(context) - len(context.rstrip())
    context, forced = context[:len(context) - spaces], (context[len(context) - spaces:] + continuation).encode()
    prompts = [m.encode(context) if context else [m.prefix_token_id] for m in members]
    if bos:
        prompts = [p if p[:1] == [m.prefix_token_id] else [m.prefix_token_id, *p] for m, p in zip(members, prompts)]
    total, greedy = 0.0, True
    for i, byte in enumerate(forced):
        dists = [naive_next_byte(m, model, p, tail, forced[:i])
                 for m, model, p, tail in zip(members, models, prompts, tails)]
        mixed = [sum(w * d[b] for w, d in zip(weights, dists)) / sum(weights) for b in range(257)]
        total += math.log(mixed[byte] or 1e-300)  # zero: a byte token inside a character (no branch opens)
        greedy = greedy and max(range(257), key=lambda b: (mixed[b], -b)) == byte
    return total, greedy


def naive_live_score(members_, models, request, weights):
    """naive_byte_score's sum with the rule for a member without mass: it is left out of the average
    at that byte (naive_next_byte fails on it: no term, or no mass)."""
    tails = [CanonicalTail.from_view(m.vocab, continuation_encoder(
        lambda t, m=m: m.encode(t, add_special_tokens=False))) for m in members_]
    prompts = [m.encode(request.prompt.text) for m in members_]
    forced, total, dead = request.continuation.encode(), 0.0, 0
    for i, byte in enumerate(forced):
        live = []
        for member, model, prompt, tail, w in zip(members_, models, prompts, tails, weights):
            try:
                live.append((w, naive_next_byte(member, model, prompt, tail, forced[:i])))
            except (ValueError, ZeroDivisionError):
                dead += 1
        total += math.log(sum(w * d[byte] for w, d in live) / sum(w for w, _ in live))
    return total, dead


# ------------------------------------------------------------------ Cool-Fusion and SweetSpan
def naive_span(members, models, request, segment_end, choose, main=0):
    """One request, every forward recomputed from the full sequence; same rules as span_level.py."""
    seqs = [m.render(request.prompt) for m in members]
    main_ids, committed, finish = [], "", None

    while finish is None:
        proposals = []
        for u, member in enumerate(members):
            tokens, proposal = [], None
            while proposal is None:
                token = int(next_logprobs(models[u], seqs[u] + tokens).argmax())
                if token in member.stop_ids:
                    proposal = (text_of(member, tokens), tuple(tokens), "stop_id")
                    break
                tokens.append(token)
                text = text_of(member, tokens)
                if any(x and x in committed + text for x in request.until):
                    proposal = (text, tuple(tokens), "until")
                elif len(tokens) >= request.max_new_tokens - len(main_ids):
                    proposal = (text, tuple(tokens), "length")
                else:
                    end = segment_end(u, text)
                    if end is not None:
                        size = len(text[:end].encode())
                        cut = [c for c in range(1, len(tokens) + 1) if len(member.vocab.join(tokens[:c])) == size]
                        if cut:
                            proposal = (text[:end], tuple(tokens[:cut[0]]), None)
            proposals.append(proposal)
        keys = list(dict.fromkeys((p[0], p[2]) for p in proposals))
        own = {}
        for u, p in enumerate(proposals):
            own.setdefault((p[0], p[2]), {})[u] = p[1]
        tokens_for = [[own[key].get(v) or tuple(member_continuation(members[v])(key[0]) if key[0] else [])
                       for key in keys] for v in range(len(members))]
        if len(keys) == 1:
            winner = 0
        else:
            table = []
            for j, key in enumerate(keys):
                row = []
                for v, member in enumerate(members):
                    ids = list(tokens_for[v][j])
                    logprobs = []
                    for t in range(len(ids)):
                        logprobs.append(float(next_logprobs(models[v], seqs[v] + ids[:t])[ids[t]]))
                    if key[1] is not None:
                        end = next_logprobs(models[v], seqs[v] + ids)
                        logprobs.append(max(float(end[s]) for s in member.stop_ids))
                    row.append(math.exp(-sum(logprobs) / len(logprobs)))
                table.append(row)
            winner = choose(table)
        text, finish = keys[winner]
        committed += text
        for v in range(len(members)):
            seqs[v] = seqs[v] + list(tokens_for[v][winner])
        main_ids += list(tokens_for[main][winner])
        if finish is None and len(main_ids) >= request.max_new_tokens:
            finish = "length"
    return cut_at_until(members[main].decode(main_ids), request.until)


# ------------------------------------------------------------------ SAFE (Sec. 3.2-3.3)
def naive_safe(members, models, request, draft_tokens=5, sharpen=0.5, drafter=0, window=4, floor=0.1, gate=None):
    """One request, every forward recomputed from scratch, every verifier re-tokenised from
    scratch, the skip rules, the union average and the sharpening by dicts (paper Sec. 3.2-3.3)."""
    verifiers = [v for v in range(len(members)) if v != drafter]

    def key(u, token):
        m = members[u]
        if token in m.stop_ids:
            return STOP_KEY + m.vocab.pieces[token]
        return m.vocab.pieces[token] if m.vocab.pieces[token] and token not in m.vocab.special_ids else None

    def logprobs(u, ids):
        return next_logprobs(models[u], prompts[u] + ids)

    def own_probability(u, lp, token):
        """u's probability of its token of the draft (None: of stopping)."""
        probs = lp.exp()
        return float(sum(probs[s] for s in members[u].stop_ids)) if token is None else float(probs[token])

    def mixed_choice(dists):
        projected = []
        for u, lp in enumerate(dists):
            mass: dict[bytes, float] = {}
            for token, p in enumerate(lp.exp().tolist()):
                k = key(u, token)
                if k is not None:
                    mass[k] = mass.get(k, 0.0) + p
            projected.append(mass)
        union: dict[bytes, float] = {}
        for mass in projected:
            for k, p in mass.items():
                union[k] = union.get(k, 0.0) + p / len(dists)
        order = list(union)
        if max(union.values()) < sharpen:  # Sec. 3.3: lambda-floored drafter tokens take the mass of their extensions
            tops = [sorted(mass, key=lambda e: -mass[e])[:10] for mass in projected]
            pool = {e for top in tops for e in top}
            score = dict(union)
            for c in tops[drafter]:
                if c.startswith(STOP_KEY) or c == b" " or not union[c] > floor:
                    continue
                score[c] = union[c] + sum(union[o] for o in pool if o != c and not o.startswith(STOP_KEY)
                                          and o.startswith(c))
            union = score
        return max(order, key=lambda e: (union[e], -order.index(e)))

    tails = {v: CanonicalTail.from_view(members[v].vocab, continuation_encoder(
        lambda text, m=members[v]: m.encode(text, add_special_tokens=False))) for v in verifiers}
    appender = text_appender(members[drafter], window)
    prompts = [m.render(request.prompt) for m in members]
    pieces = members[drafter].vocab.pieces
    text, own, writer_ids, count = b"", [], [], 0
    while True:
        tokens, seen, stop = [], [], False
        while True:
            seen.append(logprobs(drafter, own + tokens))
            pick = int(seen[-1].argmax())
            if pick in members[drafter].stop_ids:
                stop = True
                break
            tokens.append(pick)
            done = (text + b"".join(pieces[t] for t in tokens)).decode("utf-8", "replace")
            if len(tokens) >= draft_tokens or count + len(tokens) >= request.max_new_tokens or any(
                    u in done for u in request.until):
                break
        starts = [len(text) + sum(len(pieces[t]) for t in tokens[:i]) for i in range(len(tokens) + 1)]
        readings = {}
        for v in verifiers:
            ids, pending = tails[v].canonical(text + b"".join(pieces[t] for t in tokens))
            ends = [sum(len(members[v].vocab.pieces[i]) for i in ids[:j]) for j in range(len(ids) + 1)]
            readings[v] = (ids, ends)
        kept, chosen = len(tokens), None
        for t in range(len(tokens) + stop):
            last = t == len(tokens)
            at = {}
            for v, (ids, ends) in readings.items():
                if starts[t] in ends and (last or ends.index(starts[t]) < len(ids)):
                    at[v] = ends.index(starts[t])
            if len(at) < len(verifiers):
                continue  # not stable
            dists = {v: logprobs(v, readings[v][0][:j]) for v, j in at.items()}
            agree = all((int(dists[v].argmax()) in members[v].stop_ids) if last
                        else int(dists[v].argmax()) == readings[v][0][at[v]] for v in verifiers)
            if agree:
                continue
            average = own_probability(drafter, seen[t], None if last else tokens[t]) + sum(
                own_probability(v, dists[v], None if last else readings[v][0][at[v]]) for v in verifiers)
            if average / len(members) > 0.5:
                continue
            if gate is not None and float(seen[t].exp().max()) >= gate:
                continue
            entry = mixed_choice([seen[t] if u == drafter else dists[u] for u in range(len(members))])
            mine = STOP_KEY if last else pieces[tokens[t]]
            if (entry.startswith(STOP_KEY) and last) or entry == mine:
                continue
            kept, chosen = t, entry
            break
        text += b"".join(pieces[t] for t in tokens[:kept])
        own += tokens[:kept]
        count += kept
        if writer_ids is not None:
            writer_ids += tokens[:kept]
        if (chosen is None and stop) or (chosen is not None and chosen.startswith(STOP_KEY)):
            break
        if chosen is not None:
            plan = appender.plan(own, chosen)
            own = own[:len(own) - plan.drop] + list(plan.ids)
            text += chosen
            count += 1
            exact = appender.by_bytes.get(chosen)
            writer_ids = writer_ids + [exact] if writer_ids is not None and exact is not None else None
        rendered = members[drafter].decode(writer_ids) if writer_ids is not None else text.decode("utf-8", "replace")
        if any(u in rendered for u in request.until) or count >= request.max_new_tokens:
            break
    if writer_ids is not None:
        return members[drafter].decode(writer_ids)
    rendered = text.decode("utf-8", "replace")
    return rendered[1:] if members[drafter].vocab.strips_leading_space and rendered.startswith(" ") else rendered


# ------------------------------------------------------------------ GaC's seeded sampling over the union
def naive_sample(union, weights, logprobs, temperature, generator):
    """One row, in float64 with Python sums: q(u) = sum_i w_i sum_{t -> u} p_i(t) / sum_i w_i,
    then the first entry whose cumulative q^(1/T) exceeds u x the total, u from the generator."""
    q = [0.0] * union.size
    for mapping, lp, weight in zip(union.maps, logprobs, weights):
        for token, entry in zip(mapping.src_ids.tolist(), mapping.union_ids.tolist()):
            q[entry] += weight * float(lp[token].double().exp()) / sum(weights)
    tempered = torch.tensor(q, dtype=torch.float64).pow(1 / temperature)
    uniform = float(torch.rand((), dtype=torch.float64, generator=generator))
    cumulative = tempered.cumsum(0)
    return int((cumulative > uniform * float(cumulative[-1])).nonzero()[0])
