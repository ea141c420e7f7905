"""Multiple-choice questions decided by position, counted from a row's samples.

lm-eval turns a question's log-likelihoods into its answer in ``process_results`` (api/task.py):
``pred = np.argmax(lls)``, the first of equal values. When two or more choices share the best score,
the answer is the first of them, whatever they say: the question counts toward accuracy by its
choices' order (a method that gives several choices the same score, or the same floor, is scored on
position). Every sample of a multiple-choice task holds its choices' scores as lm-eval read them
(``filtered_resps``: one ``(log-likelihood, is_greedy)`` per choice), so the count is exact for any
method and any route, resumed rows included. It is taken on the raw scores (``acc``); ``acc_norm``
divides each by its choice's length first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def _choice_scores(sample: Mapping) -> list[float] | None:
    """The log-likelihood of each choice of a multiple-choice sample (strings once lm-eval saved them),
    or None for any other sample (a generation, a single continuation)."""
    scored = sample.get("filtered_resps")
    if not isinstance(scored, (list, tuple)) or len(scored) < 2:
        return None
    if not all(isinstance(pair, (list, tuple)) and len(pair) == 2 for pair in scored):
        return None
    try:
        scores = [float(pair[0]) for pair in scored]
    except (TypeError, ValueError):
        return None
    if "acc_mutual_info" in (sample.get("metrics") or ()):  # the second half: the choices without context
        scores = scores[:len(scores) // 2]
    return scores


def tied_at_the_top(scores: Sequence[float]) -> bool:
    """Whether the best score is shared: np.argmax then picks the first of them by position."""
    best = max(scores)
    return sum(score == best for score in scores) > 1


def position_ties(samples: Mapping[str, Sequence[Mapping]]) -> dict[str, dict[str, int]]:
    """Per multiple-choice task: its questions, and those whose best score two or more choices share
    (one filter's samples: every filter holds the same scores)."""
    counts: dict[str, dict[str, int]] = {}
    for task, records in samples.items():
        records = [r for r in records if r.get("filter") == records[0].get("filter")] if records else []
        scored = [scores for scores in map(_choice_scores, records) if scores is not None]
        if scored:
            counts[task] = {"questions": len(scored), "tied": sum(map(tied_at_the_top, scored))}
    return counts
