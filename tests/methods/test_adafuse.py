"""AdaFuse: the top-1 margin and mean-NLL score by hand, the cached batched path (with exploration,
both commit rules) against a naive uncached reference, and batch invariance with exploration
(identity, Ray and the statistics record without exploration: tests/test_method_contract.py)."""

import math

import pytest
import torch

from ensemble_bench.decoding.feeding import member_continuation
from ensemble_bench.decoding.stopping import cut_at_until
from ensemble_bench.errors import UserError
from ensemble_bench.members import LocalMember, Prompt
from ensemble_bench.methods import GenerationRequest, get_method
from ensemble_bench.methods.adafuse import AdaFuse, AdaFuseParams, mean_nll, top1_margin
from ensemble_bench.methods.span_level import text_of
from ensemble_bench.recipe import parse_recipe
from ensemble_bench.vocab.words import common_ends
from tests.tiny import CORPUS, outputs


def test_margin_and_score_hand_checked():
    logprobs = torch.tensor([0.6, 0.25, 0.15]).log()
    assert top1_margin(logprobs) == pytest.approx(0.35)
    assert top1_margin(torch.tensor([1.0, 0.0]).log()) == pytest.approx(1.0)
    assert mean_nll([math.log(0.5), math.log(0.25)]) == pytest.approx((math.log(2) + math.log(4)) / 2)
    assert mean_nll([]) == math.inf


def test_parameters_are_the_papers_and_bad_ones_are_one_line_errors():
    params = AdaFuseParams()
    assert (params.theta_delta, params.max_words, params.beam_size, params.commit_rule, params.word_unit) == \
        (0.7, 3, 3, "paper", "boundaries")
    assert get_method("adafuse") is AdaFuse
    for bad in ({"theta_delta": 1.5}, {"max_words": 0}, {"beam_size": 0}, {"commit_rule": "other"},
                {"word_unit": "spaces"}):
        recipe = {"name": "x", "members": [{"model": "a"}, {"model": "b"}], "method": {"name": "adafuse", **bad},
                  "tasks": ["piqa"]}
        with pytest.raises(UserError) as error:
            parse_recipe(recipe)
        assert "\n" not in str(error.value)


# ------------------------------------------------------------------ naive reference
class Naive:
    """One request, every forward recomputed from the full sequence; the rules of the module docstring."""

    def __init__(self, members, models, params: AdaFuseParams):
        self.members, self.models, self.p = members, models, params

    def after(self, v, ids):
        with torch.no_grad():
            return self.models[v](torch.tensor([ids])).logits[0, -1].float().log_softmax(-1)

    def ends(self, text):
        ends = common_ends([m.word_starts(text) for m in self.members])
        if self.p.word_unit == "whitespace":  # where a run of whitespace (as str.split sees it) begins
            return [e for e in ends if text[e - 1:e + 1].split() == [text[e - 1]]]
        return ends

    def starts(self, u, text, tokens):
        """(offset, index of the token beginning there) of each word start after the first."""
        out = []
        for end in self.ends(text):
            size = len(text[:end].encode())
            t = [c for c in range(1, len(tokens)) if len(self.members[u].vocab.join(tokens[:c])) == size]
            if t:
                out.append((end, t[0]))
        return out

    def confident(self, dist):
        return top1_margin(dist) >= self.p.theta_delta

    def end_of(self, u, text, tokens, picked, words):
        if words is not None:
            ends = self.ends(text)
            return ends[words - 1] if len(ends) >= words else None
        if not self.confident(picked[0]):
            return self.end_of(u, text, tokens, picked, 1)
        for j, (end, t) in enumerate(self.starts(u, text, tokens), start=1):
            if j == self.p.max_words:
                return end
            if not self.confident(picked[t]):
                return self.end_of(u, text, tokens, picked, j + 1)
        return None

    def decode(self, u, seq, request, committed, budget, forced=(), words=None):
        member, tokens, picked = self.members[u], [], []
        while True:
            dist = self.after(u, seq + tokens)
            token = forced[len(tokens)] if len(tokens) < len(forced) else int(dist.argmax())
            picked.append(dist)
            if token in member.stop_ids:
                return (text_of(member, tokens), tuple(tokens), "stop_id"), tokens, picked
            tokens.append(token)
            text = text_of(member, tokens)
            if any(x and x in committed + text for x in request.until):
                return (text, tuple(tokens), "until"), tokens, picked
            if len(tokens) >= budget:
                return (text, tuple(tokens), "length"), tokens, picked
            end = self.end_of(u, text, tokens, picked, words) if len(tokens) > len(forced) else None
            if end is not None:
                size = len(text[:end].encode())
                cut = [c for c in range(1, len(tokens) + 1) if len(member.vocab.join(tokens[:c])) == size]
                if cut:
                    return (text[:end], tuple(tokens[:cut[0]]), None), tokens, picked

    def candidates(self, u, seq, request, committed, budget):
        first, tokens, picked = self.decode(u, seq, request, committed, budget)
        found, p = [first], self.p
        if p.beam_size == 1:
            return found
        at, words = None, None
        starts = self.starts(u, text_of(self.members[u], tokens), tokens)[:p.max_words - 1]
        if not self.confident(picked[0]):
            at, words = 0, 1
        elif first[2] is not None:
            pass
        elif p.commit_rule == "paper":
            uncertain = [(t, j) for j, (_, t) in enumerate(starts, start=2) if not self.confident(picked[t])]
            at, words = uncertain[0] if uncertain else (None, None)
        elif p.max_words >= 2 and len(starts) >= p.max_words - 1 and all(
                self.confident(picked[t]) for _, t in starts[:p.max_words - 2]):
            at, words = starts[p.max_words - 2][1], p.max_words
        if at is not None:
            for token in picked[at].topk(p.beam_size).indices.tolist()[1:]:
                found.append(self.decode(u, seq, request, committed, budget, tuple(tokens[:at]) + (token,), words)[0])
        return found

    def nll(self, v, seq, ids, final):
        logprobs = [float(self.after(v, seq + ids[:t])[ids[t]]) for t in range(len(ids))]
        if final == "stop_id":
            logprobs.append(max(float(self.after(v, seq + ids)[s]) for s in self.members[v].stop_ids))
        return mean_nll(logprobs)

    def generate(self, request, lead=0):
        """The text, and the candidates of each round that had a choice."""
        seqs = [m.render(request.prompt) for m in self.members]
        lead_ids, committed, finish, choices = [], "", None, []
        while finish is None:
            own: dict = {}
            for u in range(len(self.members)):
                for text, tokens, final in self.candidates(u, seqs[u], request, committed,
                                                           request.max_new_tokens - len(lead_ids)):
                    own.setdefault((text, final), {}).setdefault(u, tokens)
            keys = list(own)
            tokens_for = [[own[key].get(v) or tuple(member_continuation(m)(key[0]) if key[0] else []) for key in keys]
                          for v, m in enumerate(self.members)]
            winner = 0
            if len(keys) > 1:
                choices.append([key[0] for key in keys])
                means = [sum(self.nll(v, seqs[v], list(tokens_for[v][j]), key[1]) for v in range(len(self.members)))
                         / len(self.members) for j, key in enumerate(keys)]
                winner = means.index(min(means))
            text, finish = keys[winner]
            committed += text
            seqs = [seq + list(tokens_for[v][winner]) for v, seq in enumerate(seqs)]
            lead_ids += list(tokens_for[lead][winner])
            if finish is None and len(lead_ids) >= request.max_new_tokens:
                finish = "length"
        return cut_at_until(self.members[lead].decode(lead_ids), request.until), choices


def margins_of(member, prompts):
    """The top-1 margins of a member's first next-token distributions (to pick thresholds that split them)."""
    return sorted(top1_margin(d) for d in member.prefill([member.render(Prompt(text=p)) for p in prompts]))


REQUESTS = [GenerationRequest(Prompt(text=CORPUS[i][: 14 + 7 * i]), ("\n\n",), 16) for i in range(4)]


@pytest.mark.parametrize("rule,unit", [("paper", "boundaries"), ("code", "boundaries"), ("paper", "whitespace"),
                                       ("code", "whitespace")])
@pytest.mark.parametrize("threshold", ["always", "median", "never"])
@pytest.mark.parametrize("pairing", ["mixed", "twins"])
def test_cached_batched_path_equals_naive_reference(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model, rule, unit,
                                                    threshold, pairing):
    """Mixed tokenizers share few word boundaries; twins share every one (spans of several words)."""
    def pair():
        second = (sp_model, sp_tokenizer) if pairing == "mixed" else (bpe_model, bpe_tokenizer)
        return [LocalMember(bpe_model, bpe_tokenizer, "a"), LocalMember(*second, "b")]
    margins = margins_of(pair()[0], [CORPUS[i][:30] for i in range(len(CORPUS))])
    theta = {"always": 1.0, "median": margins[len(margins) // 2], "never": 0.0}[threshold]
    params = AdaFuseParams(theta_delta=theta, commit_rule=rule, max_words=3, beam_size=3, word_unit=unit)
    method = AdaFuse(pair(), params, batch_size=3)
    forced = []
    branches = method._branches
    method._branches = lambda *args: forced.extend(len(b.forced) for b in branches(*args)) or branches(*args)
    fast = method.generate(REQUESTS)
    naive = Naive(pair(), [bpe_model, sp_model if pairing == "mixed" else bpe_model], params)
    rounds = {t["prompt_tail"]: [r["candidates"] for r in t["rounds"]] for t in method.traces}  # finishing order
    assert [(g.text, rounds[r.prompt.text]) for g, r in zip(fast, REQUESTS)] == [naive.generate(r) for r in REQUESTS]
    # a word after the first is explored (the code rule explores word 3 only: the tiny models' texts have
    # too few whitespace words for that)
    if threshold == "median" and pairing == "twins" and (rule, unit) != ("code", "whitespace"):
        assert max(forced) > 1
    info = {**method.info(), **method.info()[method.name]}  # the shared fields and AdaFuse's own
    assert info["member_states"] > 0 and 0 <= info["ensembled_fraction"] <= 1
    if threshold == "always":  # every state uncertain: every member explores, every round is scored
        assert info["uncertain_states"] == info["member_states"] and info["ensembled_fraction"] == 1
        assert any(len(r["candidates"]) > 2 for t in method.traces for r in t["rounds"])
    if threshold == "never" and rule == "paper":
        assert info["uncertain_states"] == 0
    if threshold == "median":  # confident and uncertain states both occur
        assert 0 < info["uncertain_states"] < info["member_states"]


def test_whitespace_words_keep_their_punctuation(bpe_tokenizer, bpe_model):
    """The script's unit: a word ends only where whitespace begins, so "Paris," is one word."""
    def ends(unit):
        twins = [LocalMember(bpe_model, bpe_tokenizer, name) for name in "ab"]
        return AdaFuse(twins, AdaFuseParams(word_unit=unit))._common_ends(text)
    text = "It's Paris, France.  Then\nmore"
    boundaries = ends("boundaries")
    assert {10, 18} <= set(boundaries)  # "," and "." start words of their own for this tokenizer
    assert ends("whitespace") == [4, 11, 19, 25]  # " Paris,", " France.", "  Then", "\nmore"
    assert set(ends("whitespace")) <= set(boundaries)


@pytest.mark.parametrize("rule", ["paper", "code"])
def test_exploration_is_batch_invariant(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model, rule):
    def run(batch_size):
        members = [LocalMember(bpe_model, bpe_tokenizer, "a"), LocalMember(sp_model, sp_tokenizer, "b")]
        return outputs(AdaFuse(members, AdaFuseParams(theta_delta=0.02, commit_rule=rule), batch_size=batch_size))
    assert run(1) == run(3)


@pytest.mark.parametrize("same_model", ["bpe"], indirect=True)
def test_a_model_with_itself_explores_as_one_model(same_model, bpe_model):
    """With exploration, a member with itself is AdaFuse's test-time scaling over that one model: the
    naive reference over one member."""
    params = AdaFuseParams(theta_delta=1.0)
    twins = AdaFuse([same_model("a"), same_model("b")], params, batch_size=2)
    naive = Naive([same_model("solo")], [bpe_model], params)
    assert [g.text for g in twins.generate(REQUESTS)] == [naive.generate(r)[0] for r in REQUESTS]
