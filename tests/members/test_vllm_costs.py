"""What a vLLM member decides without its engine (no vllm needed): which prompt tokens its prefix cache
may serve (``ComputedBlocks``), what a call costs (``StepCosts``) and so how a block read moves its rows
(``VllmMember._read_steps``)."""

from types import SimpleNamespace

import pytest

from ensemble_bench.members.vllm import VllmMember
from ensemble_bench.members.vllm_engine import ComputedBlocks, StepCosts


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
