"""Every method that samples (``Method.samples``), on the two tiny members: a request that samples draws
the same text at batch 1 and batch 8, beside greedy requests and other repeats; greedy requests in the
same batches keep their greedy texts; repeats draw different texts; the methods that cannot sample refuse
in one line. The draw's distribution: tests/decoding/test_sampling.py, and here a member alone."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from ensemble_bench.decoding.sampling import RequestSampling, SamplingParams, request_key
from ensemble_bench.errors import UserError
from ensemble_bench.members import LocalMember, Prompt
from ensemble_bench.methods import METHODS, GenerationRequest
from tests.tiny import REQUESTS, outputs, sampled

# the parameter sets drawn with: each method's modes that decide differently (CoRE's fusion, a gate, the union)
SAMPLED_PARAMS = [
    ("single", {}), ("gac", {}), ("gac", {"threshold": 0.5, "lead": 1}), ("gac", {"core": True}),
    ("unite", {"retokenize": "local"}), ("unite", {"retokenize": "local", "core": True, "lead": 1}),
    ("deepen", {"retokenize": "local"}), ("deepen", {"retokenize": "local", "support": None, "steps": 2}),
    ("packllm", {}), ("packllm", {"alignment": "union"}), ("packllm", {"core": True}),
    ("packllm", {"core": True, "alignment": "union"}), ("chared", {}), ("byte_level", {}), ("lvr", {}),
    ("eva", {"retokenize": "local", "overlap": "direct"}),
    ("eva", {"retokenize": "local", "overlap": "direct", "core": True}),
    ("voting", {}), ("mbr", {}), ("rerank", {}),
]


def test_every_method_that_samples_is_drawn_with_here():
    assert {name for name, _ in SAMPLED_PARAMS} == {name for name, cls in METHODS.items() if cls.samples}


def make(name: str, params: dict, members: list, batch_size: int):
    cls = METHODS[name]
    chosen = members[:1] if cls.alone else members
    return cls(chosen, cls.Params.model_validate(params), batch_size=batch_size)


def mixed_requests(temperature: float) -> list[GenerationRequest]:
    """Greedy requests, and two repeats of every request drawing at ``temperature``, in one list."""
    return [*REQUESTS[:2], *sampled(temperature=temperature), *sampled(repeat=1, temperature=temperature, top_k=20)]


@pytest.mark.parametrize("name, params", SAMPLED_PARAMS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(SAMPLED_PARAMS)])
def test_samples_do_not_depend_on_the_batch_and_greedy_rows_stay_greedy(pair, name, params):
    requests = mixed_requests(temperature=1.5)
    one = outputs(make(name, params, pair(), 1), requests)
    eight = outputs(make(name, params, pair(), 8), requests)
    assert one == eight
    greedy = outputs(make(name, params, pair(), 8), REQUESTS)
    assert one[:2] == greedy[:2]  # greedy requests beside sampled ones
    first, second = one[2:7], one[7:]
    assert first != second and first != greedy  # the repeats differ, and differ from greedy


@pytest.mark.parametrize("name", ["gac", "byte_level"])
def test_greedy_settings_are_the_greedy_path(pair, name):
    """A request whose settings are greedy (do_sample with temperature 0) decodes exactly as one without any."""
    greedy = SamplingParams(do_sample=True, temperature=0.0)
    requests = [replace(r, sampling=RequestSampling(greedy, 1, "k")) for r in REQUESTS]
    assert outputs(make(name, {}, pair(), 3), requests) == outputs(make(name, {}, pair(), 3))


@pytest.mark.parametrize("name", sorted(name for name, cls in METHODS.items() if not cls.samples))
def test_a_method_that_cannot_sample_refuses_in_one_line(pair, name):
    method = make(name, {}, pair(), 2)
    assert method.generate(REQUESTS[:1])  # greedy requests run
    with pytest.raises(UserError) as raised:
        method.generate(sampled(REQUESTS[:1]))
    assert "\n" not in str(raised.value) and f"method '{name}' decodes greedily only" in str(raised.value)


def test_a_member_alone_draws_its_first_token_from_its_shaped_distribution(bpe_model, bpe_tokenizer):
    """2,000 first tokens (batches of 250) against the member's next-token distribution at temperature 1.3
    and top-k 6: a chi-square below its 0.999 quantile (5 degrees of freedom), at a fixed seed."""
    member = LocalMember(bpe_model, bpe_tokenizer, "a")
    prompt = Prompt(text="Question: What is 12 plus 30? Answer:")
    params = SamplingParams(do_sample=True, temperature=1.3, top_k=6)
    key = request_key(prompt.text, {})
    requests = [GenerationRequest(prompt, (), 1, RequestSampling(params, 99, key, k)) for k in range(2000)]
    single = METHODS["single"]([member], METHODS["single"].Params(), batch_size=250)
    counts: dict[str, int] = {}
    for generation in single.generate(requests):
        counts[generation.text] = counts.get(generation.text, 0) + 1
    first = member.prefill([member.render(prompt)])[0]
    expected = torch.softmax(params.shape(first[None]), dim=-1)[0]
    top = expected.topk(6)
    texts = [member.decode([int(token)]) for token in top.indices]
    assert set(counts) <= set(texts)
    chi2 = sum((counts.get(text, 0) - 2000 * float(p)) ** 2 / (2000 * float(p)) for text, p in zip(texts, top.values))
    assert chi2 < 20.52
