"""report/stats.py against cases worked out by hand: Wilson intervals, McNemar tables, bootstraps
with a fixed seed, oracle and agreement counts, and the corpus-level bootstrap for BLEU."""

import math

import pytest

from ensemble_bench.report import stats
from ensemble_bench.report.paired import examples_score, interval_of
from ensemble_bench.report.samples import Example
from ensemble_bench.tasks import get_benchmark
from tests.tolerances import FLOAT64_SUMS, assert_rounded


@pytest.mark.parametrize("successes,n,low,high", [
    (65, 100, 0.5525, 0.7364),   # p=.65: centre (.65 + 1.92/100) / 1.0384 = .6445, half .0920
    (0, 16, 0.0, 0.1936),        # zero: high = z^2 / (n + z^2) = 3.8415 / 19.8415
    (16, 16, 0.8064, 1.0),       # the mirror image
    (1, 2, 0.0945, 0.9055),
])
def test_wilson_interval_by_hand(successes, n, low, high):
    got = stats.wilson_interval(successes, n)
    assert_rounded((low, high), got, 4, FLOAT64_SUMS)  # the hand values are rounded to 4 decimals


def test_wilson_of_no_examples_is_undefined():
    assert all(math.isnan(v) for v in stats.wilson_interval(0, 0))


@pytest.mark.parametrize("only_first,only_second,p", [
    (5, 3, 2 * (1 + 8 + 28 + 56) / 2 ** 8),   # 0.7266: the CI baseline's gac vs smollm2 on PIQA
    (0, 2, 2 * 1 / 2 ** 2),                   # 0.5: two losses, no win
    (0, 6, 2 * 1 / 2 ** 6),                   # 0.03125
    (10, 0, 2 / 2 ** 10),
    (4, 4, 1.0),                              # balanced: capped at 1
    (0, 0, 1.0),                              # no discordant pair: nothing to test
])
def test_mcnemar_exact_by_hand(only_first, only_second, p):
    assert stats.mcnemar_exact(only_first, only_second) == pytest.approx(p)
    assert stats.mcnemar_exact(only_second, only_first) == pytest.approx(p)  # two-sided: symmetric


def test_paired_counts_and_the_test_they_choose():
    ensemble = [1, 1, 1, 1, 1, 1, 0, 0, 0, 0]
    member = [1, 1, 1, 0, 0, 0, 0, 0, 0, 1]
    assert stats.paired_counts(ensemble, member) == (3, 1, 6)
    paired = stats.paired_test(ensemble, member)
    assert paired.test == "McNemar exact" and paired.p_value == pytest.approx(2 * (1 + 4) / 16)
    assert paired.examples == 10
    continuous = stats.paired_test([0.5, 0.7, 0.9], [0.4, 0.7, 0.1])
    assert continuous.test == "paired bootstrap" and (continuous.wins, continuous.losses, continuous.ties) == (2, 0, 1)


def test_percentile_interpolates():
    assert stats._percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert stats._percentile([1.0, 2.0, 3.0, 4.0], 0.0) == 1.0 and stats._percentile([1.0, 2.0, 3.0, 4.0], 1.0) == 4.0


def test_bootstrap_with_a_fixed_seed_is_reproducible_and_sensible():
    values = [0.0] * 50 + [1.0] * 50
    first = stats.bootstrap_interval(values, iters=400, seed=7)
    assert first == stats.bootstrap_interval(values, iters=400, seed=7)
    assert first != stats.bootstrap_interval(values, iters=400, seed=8)
    # the normal interval of a mean of 100 fair coins is 0.5 +- 1.96 * 0.05 = [0.402, 0.598]
    assert first[0] == pytest.approx(0.402, abs=0.03) and first[1] == pytest.approx(0.598, abs=0.03)
    assert stats.bootstrap_interval([0.3] * 20, iters=50) == pytest.approx((0.3, 0.3))


def test_bootstrap_resamples_are_the_seeded_draws():
    """Two examples, two resamples: the interval is the percentile of the means of exactly the
    draws random.Random(seed) makes, worked out here without the module."""
    import random

    generator = random.Random(3)
    draws = [[generator.randrange(2) for _ in range(2)] for _ in range(2)]
    means = sorted(sum([0.0, 1.0][i] for i in d) / 2 for d in draws)
    low = means[0] + (means[1] - means[0]) * 0.025
    high = means[0] + (means[1] - means[0]) * 0.975
    assert stats.bootstrap_interval([0.0, 1.0], iters=2, seed=3) == pytest.approx((low, high))


def test_paired_bootstrap_extremes():
    assert stats.paired_bootstrap([1.0] * 8, [0.0] * 8, iters=200) == 0.0  # always ahead: p = 0
    assert stats.paired_bootstrap([0.4] * 8, [0.4] * 8, iters=200) == 1.0  # identical rows: p = 1
    better = [0.6, 0.7, 0.8, 0.9, 0.5, 0.6, 0.7, 0.8]
    worse = [0.5, 0.75, 0.7, 0.85, 0.45, 0.65, 0.6, 0.7]
    p = stats.paired_bootstrap(better, worse, iters=500, seed=1)
    assert p == stats.paired_bootstrap(better, worse, iters=500, seed=1) and 0.0 <= p < 0.2
    with pytest.raises(ValueError):
        stats.paired_bootstrap([1.0], [1.0, 0.0])


def test_oracle_and_agreement_counts():
    a = [1, 0, 0, 1, 0]
    b = [0, 0, 1, 1, 0]
    assert stats.oracle_share([a, b]) == pytest.approx(3 / 5)  # docs 0, 2, 3: some member right
    assert stats.oracle_share([[0.2, 0.9], [0.5, 0.1]]) == pytest.approx((0.5 + 0.9) / 2)
    assert stats.agreement_share([["x", "b", "c"], ["x", "y", "c"]]) == pytest.approx(2 / 3)


def test_score_interval_picks_wilson_for_zero_one_values():
    assert stats.score_interval([1, 0, 1, 1]) == stats.wilson_interval(3, 4)
    low, high = stats.score_interval([0.2, 0.4, 0.6])
    assert 0.2 <= low < 0.4 < high <= 0.6


def test_bleu_is_bootstrapped_over_the_corpus():
    """BLEU is a corpus statistic: the interval resamples sentences and rescores the corpus, and
    the row's score is sacrebleu's corpus BLEU, not a mean of sentence scores."""
    import sacrebleu

    bench = get_benchmark("flores_de-en")
    pairs = [("the cat sat on the mat", "the cat sat on the mat"), ("a dog ran in the park", "a dog walked in a park"),
             ("it is raining today", "today it rains"), ("we like green tea", "we like green tea a lot")] * 3
    examples = [Example("flores", k, 0.0, [ref, hyp], hyp, "", ref) for k, (ref, hyp) in enumerate(pairs)]
    expected = sacrebleu.corpus_bleu([h for _, h in pairs], [[r for r, _ in pairs]]).score / 100
    assert examples_score(examples, bench) == pytest.approx(expected)
    interval = interval_of(examples, bench)
    assert interval.how == "bootstrap" and interval.low <= expected <= interval.high
    assert interval == interval_of(examples, bench)  # fixed seed


def test_corpus_metrics_are_read_on_the_reports_0_to_1_scale():
    """lm-eval's BLEU is 0-100; every report keeps scores 0..1 (shown x100), like accuracies."""
    from ensemble_bench.report.summary import metric_value

    bench = get_benchmark("flores_de-en")
    results = {"results": {bench.task: {"bleu,none": 25.0}}, "n-samples": {bench.task: {"effective": 12}}}
    assert metric_value(results, bench) == (0.25, 12)


def test_paired_bleu_uses_the_corpus_bootstrap():
    from ensemble_bench.report.paired import compare_with_members

    bench = get_benchmark("flores_de-en")
    refs = ["the cat sat on the mat", "a dog ran in the park", "it is raining today", "we like green tea"] * 3
    good = [Example("f", k, 0.0, [r, [r]], r, "", r) for k, r in enumerate(refs)]  # one-element prediction lists
    poor = [Example("f", k, 0.0, [r, "something else entirely"], "x", "", r) for k, r in enumerate(refs)]
    comparison = compare_with_members("ens", ["m1", "m2"], {"ens": good, "m1": poor, "m2": poor}, bench)
    m1 = comparison.against("m1")
    assert m1.paired.test == "paired bootstrap" and m1.paired.p_value == 0.0 and comparison.score == pytest.approx(1.0)
