"""Rerank scorers: argmax and ties on hand-written scores, round-robin pairwise ranking on
hand-written preference matrices (with a cycle), and reward / pairwise scorers built on a tiny
random sequence-classification model saved by the test itself."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

from ensemble_bench.errors import UserError
from ensemble_bench.members import Prompt
from ensemble_bench.methods.rerank import Rerank, RerankParams
from ensemble_bench.methods.scorers import (
    Classifier,
    ClassifierComparator,
    ClassifierReward,
    PairwiseScorer,
    RewardScorer,
    best_by_score,
    most_wins,
)
from ensemble_bench.methods.single import Single
from tests.tiny import REQUESTS
from tests.tolerances import TINY_MODEL, assert_close


@pytest.mark.parametrize("scores,main,chosen", [
    ([0.1, 0.7, 0.3], 0, 1),
    ([0.7, 0.7, 0.3], 1, 1),   # tie at the top: the main member
    ([0.2, 0.7, 0.7], 0, 1),   # tie without the main member: the first tied
    ([-3.0, -1.0, -2.0], 2, 1),
])
def test_best_by_score_is_the_argmax(scores, main, chosen):
    assert best_by_score(scores, main) == chosen


def from_matrix(rows):
    """A hand-written preference matrix: rows[i][j] == 1 means i is preferred to j."""
    return lambda i, j: rows[i][j] == 1


@pytest.mark.parametrize("rows,main,chosen", [
    ([[0, 1, 1], [0, 0, 1], [0, 0, 0]], 2, 0),   # a transitive order: the top one, whatever main says
    ([[0, 0, 0], [1, 0, 0], [1, 1, 0]], 0, 2),
    ([[0, 1, 0], [0, 0, 1], [1, 0, 0]], 0, 0),   # cycle a > b > c > a: one win each, main chosen
    ([[0, 1, 0], [0, 0, 1], [1, 0, 0]], 2, 2),
    ([[0, 1, 0, 0], [0, 0, 1, 1], [1, 0, 0, 1], [1, 0, 0, 0]], 0, 1),  # b and c tie on 2 wins: first
])
def test_most_wins_on_hand_written_preferences(rows, main, chosen):
    assert most_wins(len(rows), from_matrix(rows), main) == chosen


@pytest.fixture(scope="module")
def reward_dir(tmp_path_factory, bpe_tokenizer):
    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=len(bpe_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, num_labels=1,
                         pad_token_id=bpe_tokenizer.pad_token_id)
    path = tmp_path_factory.mktemp("reward")
    LlamaForSequenceClassification(config).save_pretrained(path)
    bpe_tokenizer.save_pretrained(path)
    return str(path)


def direct_score(path, text):
    model = LlamaForSequenceClassification.from_pretrained(path).eval()
    from transformers import AutoTokenizer
    ids = AutoTokenizer.from_pretrained(path)(text, return_tensors="pt")
    with torch.no_grad():
        return float(model(**ids).logits[0, 0])


def test_reward_scorer_picks_the_highest_reward_and_is_deterministic(reward_dir):
    reward = ClassifierReward(Classifier(reward_dir))
    scorer = RewardScorer(reward)
    prompt = Prompt(text="Question: What is 12 plus 30?")
    texts = [" Answer: 42.", " The quick brown fox.", " Answer: 42.", ""]
    formatted = [reward.format(prompt, t) for t in texts]
    assert formatted[0].startswith("<|im_start|>user\nQuestion")  # the scorer's own chat template
    scores = [direct_score(reward_dir, f) for f in formatted]
    assert_close(reward.scores(prompt, texts), scores, TINY_MODEL)
    expected = max(range(3), key=lambda k: (scores[k], -k))  # the empty answer is never chosen
    assert scorer.choose(prompt, texts, 0) == expected
    twins = [" Answer: 42.", " Answer: 42."]
    assert [scorer.choose(prompt, twins, 0) for _ in range(3)] == [0, 0, 0]
    assert scorer.choose(prompt, twins, 1) == 1


def test_reward_template_and_pairwise_scorer(reward_dir):
    classifier = Classifier(reward_dir)
    reward = ClassifierReward(classifier, "Human: {prompt}\nAssistant: {response}")
    assert reward.format(Prompt(text="Hi"), "Hello") == "Human: Hi\nAssistant: Hello"
    comparator = ClassifierComparator(classifier)
    prompt = Prompt(text="Question: What is 12 plus 30?")
    texts = [" 42.", " the lazy dog", " apples and pears"]
    score = {(i, j): classifier([comparator.template.format(prompt=prompt.text, a=texts[i], b=texts[j])])[0]
             for i in range(3) for j in range(3) if i != j}
    wins = [sum(score[i, j] >= score[j, i] if i < j else score[i, j] > score[j, i] for j in range(3) if j != i)
            for i in range(3)]
    expected = max(range(3), key=lambda k: (wins[k], -k))
    assert PairwiseScorer(comparator).choose(prompt, texts, 0) == expected


def test_pairwise_scorer_asks_each_pair_once_and_picks_the_most_wins():
    asked = []
    prefers = {" a": 0, " b": 2, " c": 1}  # b beats both, c beats a

    def compare(question, pairs):
        asked.extend(pairs)
        return [prefers[a] > prefers[b] for a, b in pairs]

    assert PairwiseScorer(compare).choose(Prompt(text="q"), [" a", " b", " c"], 0) == 1
    assert sorted(asked) == [(" a", " b"), (" a", " c"), (" b", " c")]


def test_untrained_head_is_refused(tmp_path, bpe_tokenizer):
    config = LlamaConfig(vocab_size=len(bpe_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    bpe_tokenizer.save_pretrained(tmp_path)
    with pytest.raises(UserError, match="no trained classification head"):
        Classifier(str(tmp_path))
    with pytest.raises(UserError, match="cannot load scorer model"):
        Classifier(str(tmp_path / "missing"))


@pytest.mark.parametrize("given,message", [
    ({"scorer": "reward"}, "scorer_model is required"),
    ({"scorer": "perplexity", "scorer_model": "x"}, "not taken by the perplexity"),
    ({"scorer": "pairwise", "scorer_model": "x", "scorer_template": "{prompt} {a}"}, "must contain"),
    ({"scorer": "reward", "scorer_model": "x", "scorer_backend": "llm-blender",
      "scorer_template": "{prompt} {response}"},
     "formats inputs itself"),
])
def test_rerank_params_validation(given, message):
    with pytest.raises(ValueError, match=message):
        RerankParams(**given)


def test_reward_rerank_end_to_end(pair, reward_dir):
    members = pair()
    rerank = Rerank(members, RerankParams(scorer="reward", scorer_model=reward_dir), batch_size=2)
    chosen = rerank.generate(REQUESTS)
    alone = [[g.text for g in Single([m], Single.Params()).generate(REQUESTS)] for m in members]
    for i, (request, generation) in enumerate(zip(REQUESTS, chosen)):
        candidates = [a[i] for a in alone]
        assert generation.text == candidates[rerank.scorer.choose(request.prompt, candidates, 0)]
    info = rerank.info()
    assert info["decode_steps"] > 0 and info[rerank.name]["scorer"] == "reward"


def test_llm_blender_rankers_go_through_the_package(pair, monkeypatch):
    """The llm-blender package is not installed here: a stand-in records the calls of our glue."""
    import sys
    import types

    calls = {}

    class Blender:
        def loadranker(self, location, device=None):
            calls["load"] = (location, device)

        def compare(self, inputs, candidates_a, candidates_b, mode, disable_tqdm):
            calls.setdefault("compare", []).append((inputs, candidates_a, candidates_b, mode))
            return [len(a) > len(b) for a, b in zip(candidates_a, candidates_b)]  # longer wins

        def rank(self, inputs, candidates, return_scores, disable_tqdm):
            calls.setdefault("rank", []).append((inputs, candidates, return_scores))
            return [[-len(c) for c in candidates[0]]]  # shorter scores higher

    members = pair()
    params = RerankParams(scorer="pairwise", scorer_model="llm-blender/pair-ranker", scorer_backend="llm-blender")
    monkeypatch.setitem(sys.modules, "llm_blender", None)
    with pytest.raises(UserError, match="pip install llm-blender"):
        Rerank(members, params)
    monkeypatch.setitem(sys.modules, "llm_blender", types.SimpleNamespace(Blender=Blender))
    rerank = Rerank(members, params)
    assert calls["load"] == ("llm-blender/pair-ranker", "cpu")
    texts = [" short", " a longer answer"]
    assert rerank.scorer.choose(Prompt(text="q"), texts, 0) == 1
    assert calls["compare"] == [(["q"], [" short"], [" a longer answer"], "[A,B]+[B,A]")]
    reward = Rerank(members, RerankParams(scorer="reward", scorer_model="openbmb/UltraRM-13b",
                                          scorer_backend="llm-blender"))
    assert reward.scorer.choose(Prompt(text="q"), texts, 1) == 0
    assert calls["rank"] == [(["q"], [texts], True)]
