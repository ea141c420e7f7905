"""What a vLLM member decides without its engine (no vllm needed): which prompt tokens its prefix cache
may serve (``ComputedBlocks``), what a call costs (``StepCosts``) and so how a block read moves its rows
(``VllmMember._read_steps``)."""

import threading
from collections import deque
from types import SimpleNamespace

import pytest
import torch

from ensemble_bench.members.vllm import VllmMember, chunk_sizes
from ensemble_bench.members.vllm_engine import STEPPING, ComputedBlocks, SteeredRow, Steering, StepCosts, real_drafts


def test_the_cache_may_serve_full_blocks_of_computed_prefixes_and_never_a_prompts_last_token():
    blocks = ComputedBlocks(block_size=32)
    text = list(range(100, 170))
    blocks.add(text)  # 70 tokens computed: two full blocks
    assert blocks.served(text + [1]) == 64
    assert blocks.served(text[:65]) == 64
    assert blocks.served(text[:64]) == 32  # the last token is always computed: its block cannot be served
    assert blocks.served(text[:40] + [0] * 30) == 32  # the second block differs
    assert blocks.served([0] + text[1:]) == 0  # a block's key holds the blocks before it
    assert ComputedBlocks(block_size=32).served(text) == 0


def test_step_costs_tell_the_per_token_cost_once_two_shapes_of_call_are_seen():
    costs = StepCosts()
    assert costs.of(4, 100) == 0
    for _ in range(3):
        costs.observe(1, 8, 0.05)  # decode steps of 8 rows: no telling steps from tokens
    assert costs.fitted() == pytest.approx((0.05, 0.0))
    costs.observe(1, 408, 0.45)  # a prompt of 400 more tokens in one step
    per_step, per_token = costs.fitted()
    assert per_token == pytest.approx(0.001) and per_step == pytest.approx(0.042)
    assert costs.of(4, 32) == pytest.approx(4 * 0.042 + 0.032)


def member(costs: StepCosts, held: list[int], stale: list[bool]) -> SimpleNamespace:
    return SimpleNamespace(step_costs=costs, computed=ComputedBlocks(32), stale=stale, handles=[object()] * len(held),
                           batch=SimpleNamespace(ids=[list(range(n)) for n in held]))


@pytest.mark.parametrize("per_token, held, stale, steps", [
    (0.0, [50], [False], 1),           # a step costs the same whatever it computes (GPU): one step
    (0.015, [50], [False], 4),         # CPU, 18 tokens of the last KV block to compute again: 4 steps in place
    (0.015, [64], [False], 1),         # CPU, the row ends on a KV block: one step computes only the block
    (0.015, [50], [True], 1),          # a cropped row is submitted again anyway: one step
    (0.015, [50, 64], [False, False], 4),
])
def test_a_block_read_takes_one_step_or_one_per_token_whichever_costs_less(per_token, held, stale, steps):
    costs = StepCosts()
    costs.observe(1, 1, 0.06)
    costs.observe(1, 1 + 100, 0.06 + 100 * per_token)
    fake = member(costs, held, stale)
    for ids in fake.batch.ids:
        fake.computed.add(ids)
    assert VllmMember._read_steps(fake, [[1, 2, 3, 4]] * len(held)) == steps


def test_a_rows_tokens_spread_over_the_steps_that_take_them():
    assert chunk_sizes(9, 1) == [9]
    assert chunk_sizes(10, 3) == [4, 3, 3]
    assert chunk_sizes(2, 2) == [1, 1]
    assert real_drafts([5, 6, 7]) == 3
    assert real_drafts([-1] * 8) == 0  # vLLM's padding of a new request that computes one token
    assert real_drafts([]) == 0


def step_answered(row: SteeredRow, logits: torch.Tensor, positions: list[int], tokens: list[int],
                  rejected: int = 0) -> tuple[torch.Tensor, dict]:
    """One engine step over ``positions`` of ``row``; the member's side, once the row published: what
    it saw (its undecided drafts, the log-probs kept), then its answer (``rejected`` drafts cropped,
    ``tokens`` next). The step's logits as the steering left them."""
    steering, seen = Steering(), {}
    steering.rows[row.key] = row

    def answer():
        with steering.cond:
            steering.cond.wait_for(lambda: row.waiting)
            seen.update(undecided=list(row.undecided), captured=list(row.captured), dist=row.dist)
            row.rejected = rejected
            row.queue.extend(tokens)
            row.first, row.waiting = True, False
            steering.cond.notify_all()

    thread = threading.Thread(target=answer)
    thread.start()
    with STEPPING:  # as the engine thread holds it through a step
        out = steering.steer(logits.clone(), [(0, row.key, positions)])
    thread.join()
    return out, seen


def test_a_drafted_step_forces_each_queued_token_and_publishes_after_the_last():
    """Four positions of one row in one step (its three drafts and the one after them): the drafts are
    its queued tokens, the log-probs wanted after them are kept, it publishes the last position with
    the drafts undecided, and the member's next token is forced there."""
    vocab = 10
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(0))
    row = SteeredRow("r", queue=deque([3, 4, 5]), first=False, wanted=frozenset({1, 2}))
    out, seen = step_answered(row, logits, [0, 1, 2, 3], [7])
    assert out.argmax(-1).tolist() == [3, 4, 5, 7]
    assert torch.isinf(out).sum() == 4 * (vocab - 1)
    assert seen["undecided"] == [3, 4, 5]
    assert torch.equal(seen["dist"], torch.log_softmax(logits[3], -1))
    # the call's token 0 was forced before this step; tokens 1 and 2 are wanted: the log-probs after them
    assert [torch.equal(a, torch.log_softmax(logits[p], -1)) for a, p in zip(seen["captured"], [1, 2])] == [True] * 2
    assert row.undecided == [] and row.rejected == 0


def test_drafts_the_member_cropped_are_rejected_where_the_first_of_them_was():
    """The member crops the last two of three drafts: its next token is forced at the position of the
    first cropped draft (vLLM's rejection sampler takes the draft before it and stops there), and the
    positions after it are left as the model computed them."""
    logits = torch.randn(4, 10, generator=torch.Generator().manual_seed(1))
    row = SteeredRow("r", queue=deque([3, 4, 5]), first=False)
    out, seen = step_answered(row, logits, [0, 1, 2, 3], [8], rejected=2)
    assert seen["undecided"] == [3, 4, 5]
    assert out[0].argmax() == 3 and out[1].argmax() == 8
    assert torch.equal(out[2:], logits[2:])
    assert row.undecided == [] and row.rejected == 0
