"""The one decoding loop (decoding/decode.py) with scripted steps: how requests stop, which rows
leave the members, what each round counts for timing; and that methods load no model code."""

import subprocess
import sys

import torch

from ensemble_bench.decoding.decode import STOP, Advance, RequestState, Round, Steps, decode_batch, text_of
from ensemble_bench.decoding.method import Timing
from ensemble_bench.members import Prompt
from ensemble_bench.methods import GenerationRequest
from ensemble_bench.vocab import VocabView


class FakeMember:
    """Ids are letters; records the rows it keeps and what it is fed."""

    max_length = 100
    vocab = VocabView((b"a", b"b", b"\n"), frozenset(), "byte-level")

    def __init__(self):
        self.kept, self.rows = [], 0

    def prefill(self, rows):
        self.rows = len(rows)
        return torch.zeros(len(rows), 3)

    def keep(self, rows):
        self.kept.append(list(rows))
        self.rows = len(rows)

    def decode(self, ids):
        return "".join("ab\n"[i] for i in ids)


def letter(i: int) -> Advance:
    return Advance(FakeMember.vocab.pieces[i], (i,), 1)


class Scripted(Steps):
    """Request r takes ``script[r][round]``; ``by_span`` rounds advance by several tokens."""

    lead = 0

    def __init__(self, script, by_span=False):
        self.members, self.script, self.by_span, self.fed = [FakeMember()], script, by_span, []

    def choose(self, dists, states):
        assert dists[0].shape[0] == len(states) == self.members[0].rows
        return Round([self.script[s.request_index][s.rounds_seen()] for s in states], dists, self.by_span)

    def feed(self, dists, states, advances):
        self.fed.append([s.request_index for s in states])
        return [torch.zeros(len(states), 3)]


class Indexed(RequestState):
    request_index: int
    seen: int

    def rounds_seen(self):
        self.seen += 1
        return self.seen - 1


def states_for(requests):
    states = []
    for index, request in enumerate(requests):
        state = Indexed.of(request)
        state.request_index, state.seen = index, 0
        states.append(state)
    return states


def request(until=(), budget=10):
    return GenerationRequest(Prompt(text="x"), until, budget)


def test_requests_stop_on_a_stop_an_until_string_or_the_budget_and_leave_every_member():
    steps = Scripted([[letter(0), STOP], [letter(1), letter(2), letter(2), letter(0)], [letter(0)] * 5])
    states = states_for([request(), request(until=("\n\n",)), request(budget=4)])
    timing = Timing()
    decode_batch(steps, [[[1], [1, 2], [1, 2, 3]]], states, timing)
    assert [(s.finish, s.count, s.ids) for s in states] == [("stop_id", 1, [0]), ("until", 3, [1, 2, 2]),
                                                             ("length", 4, [0, 0, 0, 0])]
    assert steps.members[0].kept == [[1, 2], [1], []]   # rounds 2, 3, 4: requests 0, 1, 2 stop
    assert steps.fed == [[0, 1, 2], [1, 2], [2]]        # finished rows are never fed
    assert timing.tokens_generated == 3 + 3 + 2 + 1 and timing.decode_steps == 3 and timing.batches == 1


def test_a_span_round_counts_its_tokens_per_row():
    segment = Advance(b"ab", (0, 1), 2)
    steps = Scripted([[segment, Advance(b"a", (0,), 1, "stop_id")], [Advance(b"abab", (0, 1, 0, 1), 4)]], by_span=True)
    states = states_for([request(), request(budget=4)])
    timing = Timing()
    decode_batch(steps, [[[1], [1]]], states, timing)
    assert [(s.finish, s.count) for s in states] == [("stop_id", 3), ("length", 4)]
    assert timing.tokens_generated == 2 + 4 + 1 and timing.decode_steps == 1  # round 2: one row, one token
    assert Round([segment, Advance(b"abab", (0, 1, 0, 1), 4)], [], by_span=True).steps == 3.0


def test_text_is_the_writers_decode_while_it_has_every_id_else_the_bytes():
    member = FakeMember()
    state = RequestState.of(request())
    state.take(letter(1))
    assert text_of(member, state) == "b"
    state.take(Advance(" \xc3\xa9".encode("latin-1"), None, 1))
    assert state.ids is None and text_of(member, state) == "b é" and state.count == 2


def test_methods_load_no_model_code():
    code = ("import sys, ensemble_bench.methods; "
            "print('transformers' in sys.modules, 'ensemble_bench.members.local' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
