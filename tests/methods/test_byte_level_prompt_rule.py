"""byte_level's ``prompt_rule: official`` (issue 42 item 8): the ByteSampler code's reading of the
prompt, each member's BOS and then the prompt's bytes through the covering tree, against the naive
reference that conditions every member on its BOS alone and starts the covered text with the prompt."""

import pytest
from pydantic import ValidationError

from ensemble_bench.decoding.stopping import cut_at_until
from ensemble_bench.members import LocalMember, Prompt
from ensemble_bench.methods import GenerationRequest, LoglikelihoodRequest
from ensemble_bench.methods.byte_level import ByteLevel, ByteLevelParams, after_specials, common_suffix
from tests.naive import naive_byte_level, naive_byte_score
from tests.tiny import CORPUS
from tests.tolerances import TINY_MODEL, assert_close

# prompts that end inside a word, after a space, and at a word's end: the prompt's last token can merge
SHORT = [GenerationRequest(Prompt(text=CORPUS[0][:9]), (), 4),
         GenerationRequest(Prompt(text=CORPUS[1][:12].rstrip() + " "), ("@@",), 3),
         GenerationRequest(Prompt(text=CORPUS[2][:15]), ("\n\n",), 3)]


def members_of(pairs):
    return [LocalMember(model, tok, f"m{i}") for i, (tok, model) in enumerate(pairs)]


@pytest.mark.parametrize("order,weights", [((0, 1), [1.0, 1.0]), ((1, 0), [1.0, 3.0]), ((0,), [1.0])])
def test_official_prompt_rule_equals_naive_reference(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model, order, weights):
    both = [(bpe_tokenizer, bpe_model), (sp_tokenizer, sp_model)]
    chosen = [both[i] for i in order]
    members = members_of(chosen)
    method = ByteLevel(members, ByteLevelParams(weights=weights, prompt_rule="official"), batch_size=2)
    fast = method.generate(SHORT)
    for request, generation in zip(SHORT, fast):
        slow = naive_byte_level(members, [model for _, model in chosen], request, weights, official=True)
        assert generation.text == cut_at_until(slow, request.until)
    assert [method.render(i, SHORT[0].prompt) for i in range(len(members))] == [[m.prefix_token_id] for m in members]


def test_official_rule_changes_the_output(bpe_tokenizer, bpe_model):
    """The rule is not a no-op: on these prompts BOS and the prompt boundary change what is generated."""
    members = members_of([(bpe_tokenizer, bpe_model)])
    texts = {rule: [g.text for g in ByteLevel(members, ByteLevelParams(prompt_rule=rule)).generate(SHORT)]
             for rule in ("ensbench", "official")}
    assert texts["ensbench"] != texts["official"]


def test_official_scoring_conditions_on_bos(bpe_tokenizer, bpe_model, sp_tokenizer, sp_model):
    chosen = [(bpe_tokenizer, bpe_model), (sp_tokenizer, sp_model)]
    members = members_of(chosen)
    request = LoglikelihoodRequest(Prompt(text=CORPUS[0][:14]), CORPUS[0][14:22])
    got = ByteLevel(members, ByteLevelParams(prompt_rule="official")).loglikelihood([request])[0].logprob
    exact, _ = naive_byte_score(members, [m for _, m in chosen], CORPUS[0][:14], CORPUS[0][14:22], [1.0, 1.0], bos=True)
    plain, _ = naive_byte_score(members, [m for _, m in chosen], CORPUS[0][:14], CORPUS[0][14:22], [1.0, 1.0])
    assert_close(got, exact, TINY_MODEL)
    assert not TINY_MODEL.widened(9e-4, "margin").holds(plain, exact)  # the plain rule differs


def test_the_bytes_read_are_the_shared_tail_after_special_tokens():
    assert after_specials("<s>user\nHi<e>\n<s>assistant\n", ["<s>", "<e>"]) == "assistant\n"
    assert after_specials("Plain text", ["<s>"]) == "Plain text"
    assert common_suffix(["assistant\n", "model\n"]) == "\n" and common_suffix(["ab", "ab"]) == "ab"
    assert common_suffix(["x", ""]) == ""


def test_unknown_prompt_rule_is_refused():
    with pytest.raises(ValidationError, match="prompt_rule"):
        ByteLevelParams(prompt_rule="bytes")
