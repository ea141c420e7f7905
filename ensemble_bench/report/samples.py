"""Per-example results of a run row: lm-eval's ``samples_<task>_<time>.jsonl`` files, or their
text-free extracts ``scores_<task>.jsonl`` (what a stored baseline keeps: doc id, metric value, the
row's answer; no benchmark text).

An :class:`Example` is one document of one lm-eval task as one row answered and scored it, under
the benchmark's primary metric and filter (``"exact_match,flexible-extract"``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ensemble_bench.cache import atomic_write_text
from ensemble_bench.errors import EnvironmentFault
from ensemble_bench.report.run_files import PERCENT_METRICS, leaf_tasks
from ensemble_bench.run.folder import (
    EXTRACT_GLOB,
    SAMPLES_GLOB,
    extract_file,
    read_json,
    results_files,
    samples_files,
    samples_task,
)
from ensemble_bench.tasks import Benchmark

QUESTION_FIELDS = ("question", "goal", "query", "problem", "input", "prompt", "text", "sentence", "ctx", "source")
CORPUS_METRICS = PERCENT_METRICS  # lm-eval keeps (reference, prediction) per example, scores the corpus
SHOWN_CHARS = 160


@dataclass(frozen=True)
class Example:
    task: str
    doc_id: int
    score: float          # this example's value of the primary metric (sentence-level for corpus metrics)
    item: object          # what lm-eval aggregates (the score, or [reference, prediction])
    answer: str           # the row's answer (a multiple-choice index as "(i) choice text")
    question: str
    target: str

    @property
    def key(self) -> tuple[str, int]:
        return (self.task, self.doc_id)


def metric_parts(bench: Benchmark) -> tuple[str, str]:
    name, _, filter_name = bench.primary_metric.partition(",")
    return name, filter_name or "none"


def is_corpus_metric(bench: Benchmark) -> bool:
    return metric_parts(bench)[0] in CORPUS_METRICS


def _short(text: object) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= SHOWN_CHARS else flat[:SHOWN_CHARS - 1] + "…"


def _clipped(text: object) -> str:
    """An answer or a target as written (whitespace kept, so a reader sees ' Berlin' is not 'Berlin'),
    cut to SHOWN_CHARS."""
    kept = str(text)
    return kept if len(kept) <= SHOWN_CHARS else kept[:SHOWN_CHARS - 1] + "…"


def _choices(sample: dict) -> list[str]:
    arguments = sample.get("arguments") or {}
    return [str(arguments[k].get("arg_1", "")) for k in sorted(arguments, key=lambda k: int(k.rsplit("_", 1)[-1]))
            if isinstance(arguments[k], dict)]


def _is_multiple_choice(responses) -> bool:
    return isinstance(responses, list) and bool(responses) and all(
        isinstance(r, list) and len(r) == 2 for r in responses)


def _answer(sample: dict, with_choice_text: bool = True) -> str:
    """The row's answer: its generation, or for multiple choice "(index) choice text" ("(index)"
    alone without the text, which is the benchmark's)."""
    responses = sample.get("filtered_resps")
    if _is_multiple_choice(responses):
        scores = [float(r[0]) for r in responses]
        best = scores.index(max(scores))
        choices = _choices(sample)
        text = choices[best].strip() if with_choice_text and best < len(choices) else ""
        return f"({best}) {text}".strip()
    if isinstance(responses, list):
        responses = responses[0] if responses else ""
    return str(responses)


def _question(sample: dict) -> str:
    doc = sample.get("doc") or {}
    for field in QUESTION_FIELDS:
        if isinstance(doc.get(field), str) and doc[field].strip():
            return doc[field]
    prompt = str(((sample.get("arguments") or {}).get("gen_args_0") or {}).get("arg_0", ""))
    lines = [line for line in prompt.splitlines() if line.strip()]
    return lines[-1] if lines else f"document {sample.get('doc_id')}"


def _target(sample: dict) -> str:
    target = sample.get("target", "")
    choices = _choices(sample)
    if _is_multiple_choice(sample.get("filtered_resps")) and str(target).isdigit() and int(target) < len(choices):
        return f"({target}) {choices[int(target)].strip()}"
    return str(target)


@cache
def _sentence_scorer(metric: str):
    import sacrebleu

    return {"bleu": lambda hyp, refs: sacrebleu.sentence_bleu(hyp, refs).score / 100,
            "chrf": lambda hyp, refs: sacrebleu.sentence_chrf(hyp, refs).score / 100,
            "ter": lambda hyp, refs: sacrebleu.sentence_ter(hyp, refs).score / 100}[metric]


def _references(reference) -> list[str]:
    return [str(r) for r in reference] if isinstance(reference, list) else [str(reference)]


def _prediction(prediction) -> str:
    """lm-eval allows a one-element list as the prediction."""
    return str(prediction[0] if isinstance(prediction, list) and prediction else prediction)


def _example_score(metric: str, value) -> float:
    if metric in CORPUS_METRICS and isinstance(value, list) and len(value) == 2:
        reference, prediction = value
        return _sentence_scorer(metric)(_prediction(prediction), _references(reference))
    return float(value)


def corpus_statistic(bench: Benchmark):
    """For corpus metrics: items [(reference, prediction)] -> the corpus score (0..1), as lm-eval
    aggregates them; None for metrics that are means of per-example values."""
    metric = metric_parts(bench)[0]
    if metric not in CORPUS_METRICS:
        return None
    import sacrebleu

    scorer = {"bleu": sacrebleu.corpus_bleu, "chrf": sacrebleu.corpus_chrf, "ter": sacrebleu.corpus_ter}[metric]

    def score(items) -> float:
        predictions = [_prediction(prediction) for _, prediction in items]
        references = [_references(reference) for reference, _ in items]
        width = max(len(r) for r in references)
        streams = [[r[k] if k < len(r) else r[0] for r in references] for k in range(width)]
        return scorer(predictions, streams).score / 100

    return score


def _example(task: str, sample: dict, metric: str) -> Example | None:
    value = sample.get(metric)
    if value is None or isinstance(value, (str, dict)):
        return None
    score = _example_score(metric, value)
    if isinstance(score, float) and math.isnan(score):
        return None
    return Example(task, int(sample["doc_id"]), score, value, _clipped(_answer(sample)),
                   _short(_question(sample)), _clipped(_target(sample)))


def _extract_example(task: str, line: dict, metric: str) -> Example | None:
    if line.get(metric) is None:
        return None
    value = line[metric]
    return Example(task, int(line["doc_id"]), _example_score(metric, value), value, str(line.get("answer", "")),
                   f"(text not stored; doc hash {str(line.get('doc_hash', ''))[:10]})", "")


def _leaves(row_dir: Path, bench: Benchmark) -> list[str]:
    leaves: list[str] = []
    for path in results_files(row_dir):
        results = read_json(path)
        found = leaf_tasks(results.get("group_subtasks", {}), bench.task)
        leaves += [t for t in found if t in results.get("results", {}) and t not in leaves]
    return leaves or [bench.task]


def _newest_samples(row_dir: Path, task: str) -> Path | None:
    found = samples_files(row_dir, task)
    return found[-1] if found else None


def task_examples(row_dir: Path, task: str, bench: Benchmark) -> list[Example] | None:
    """One task's examples of a row, from its newest samples file, else its extract; None if neither."""
    metric, filter_name = metric_parts(bench)
    samples = _newest_samples(row_dir, task)
    if samples is not None:
        chosen = [s for s in read_json(samples) if s.get("filter", "none") == filter_name]
        examples = [_example(task, s, metric) for s in chosen]
    else:
        extract = extract_file(row_dir, task)
        if not extract.exists():
            return None
        chosen = [line for line in read_json(extract) if line.get("filter", "none") == filter_name]
        examples = [_extract_example(task, line, metric) for line in chosen]
    return sorted((e for e in examples if e is not None), key=lambda e: e.doc_id)


def row_examples(row_dir: Path, bench: Benchmark) -> list[Example] | None:
    """Every example of a benchmark (all leaf tasks of a group) for one row, or None if the row has
    no per-example file for it."""
    found = [task_examples(row_dir, task, bench) for task in _leaves(row_dir, bench)]
    if not found or any(f is None for f in found):
        return None
    return [e for examples in found for e in examples]


def require_examples(row_dir: Path, bench: Benchmark) -> list[Example]:
    examples = row_examples(row_dir, bench)
    if examples is None:
        raise EnvironmentFault(f"{row_dir}: no per-sample file for {bench.name} ({SAMPLES_GLOB} or "
                               f"{EXTRACT_GLOB}); run the recipe again to get them")
    return examples


def write_extracts(row_dir: Path, target_dir: Path) -> list[Path]:
    """Text-free copies of a row's newest samples files: doc id, doc hash, filter, metric values
    and the row's answer (never the question, the prompt or the reference: corpus metrics such as
    BLEU keep their sentence-level score, so their tests on an extract are over sentence scores)."""
    written = []
    for samples in samples_files(row_dir):
        task = samples_task(samples)
        if _newest_samples(row_dir, task) != samples:
            continue
        lines = []
        for sample in read_json(samples):
            metrics = {m: _example_score(m, sample[m]) for m in sample.get("metrics", []) if m in sample}
            lines.append(json.dumps({"doc_id": sample["doc_id"], "doc_hash": sample.get("doc_hash", ""),
                                     "filter": sample.get("filter", "none"), **metrics,
                                     "answer": _clipped(_answer(sample, with_choice_text=False))},
                                    ensure_ascii=False))
        target = extract_file(target_dir, task)
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(target, "\n".join(lines) + "\n")
        written.append(target)
    return written
