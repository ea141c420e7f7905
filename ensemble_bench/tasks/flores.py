"""Flores translation tasks: En<->De and En<->Ro on the devtest split, scored with BLEU and chrF.

Data layout (both modes): the hub dataset ``facebook/flores`` as its parquet conversion lays it
out, one config per language (``eng_Latn``, ``deu_Latn``, ``ron_Latn``), splits ``dev`` (997) and
``devtest`` (1012), a ``sentence`` column and an ``id`` that aligns the languages. A task reads the
source and target configs and joins them by ``id`` (:func:`load_flores`, lm-eval's
``custom_dataset`` hook), so the same task YAML runs on the hub copy or on a local folder laid out
the same way.

Offline there is no Flores at all (no PyPI package ships it). The offline copy is
:data:`FIXTURE`: 30 sentences in English, German and Romanian written for ensemble-bench's tests.
They are NOT Flores sentences, every row says so (``URL`` / ``domain``), and scores on them mean
nothing beyond "the translation path works" (loading, prompting, stop at the end of the line,
BLEU / chrF, the table column).

Prompt (the papers do not print theirs; docs/translation.md): a one-line instruction, then
``shots`` examples from ``dev`` and the test sentence, each as

    German: <sentence>
    English: <reference>

separated by a blank line; the model continues after ``English:``; greedy; generation stops at
the end of the line. A seq2seq member reads only the last ``German: <sentence>`` line
(members/seq2seq.py). BLEU is sacrebleu's corpus BLEU with its default 13a tokenisation; chrF is
sacrebleu's default (character 6-grams, beta 2).

Flores-101 vs Flores-200: SweetSpan reports Flores-101 devtest, DeePEn Flores-200. Both task
families read ``facebook/flores`` (the hub has no Flores-101 that ``datasets`` >= 4 can load:
``gsarti/flores_101`` is a loading script). Flores-200 extends Flores-101 with the same 1012
devtest source sentences; the families differ in name (and paper column) only.
"""

from __future__ import annotations

from string import Template
from typing import Any

from ensemble_bench.errors import UserError

HUB_ID = "facebook/flores"
TEST_SPLIT, SHOT_SPLIT = "devtest", "dev"
# two-letter code -> (the language's name in prompts, Flores-200 config)
LANGUAGES = {"en": ("English", "eng_Latn"), "de": ("German", "deu_Latn"), "ro": ("Romanian", "ron_Latn")}
DIRECTIONS = ("en-de", "de-en", "en-ro", "ro-en")
VERSIONS = {"flores101": "Flores-101 devtest (SweetSpan)", "flores200": "Flores-200 devtest (DeePEn Table 3)"}
DEFAULT_SHOTS = 4  # SweetSpan: 4-shot for translation; DeePEn does not say
MAX_NEW_TOKENS = 256
HOOKS = "ensbench_flores"
HOOKS_SOURCE = "from ensemble_bench.tasks.flores import load_flores  # noqa: F401\n"

TASK_TEMPLATE = Template("""\
task: ${task}
custom_dataset: !function ${hooks}.load_flores
dataset_kwargs:
  path: ${path}
  source: ${source_config}
  target: ${target_config}
output_type: generate_until
test_split: ${test_split}
fewshot_split: ${shot_split}
description: "Translate the following sentences from ${source_name} to ${target_name}.\\n\\n"
doc_to_text: "{{source_language}}: {{source}}\\n{{target_language}}:"
doc_to_target: "{{target}}"
target_delimiter: " "
fewshot_delimiter: "\\n\\n"
generation_kwargs:
  until: ["\\n"]
  do_sample: false
  max_gen_toks: ${max_new_tokens}
metric_list:
  - metric: bleu
    aggregation: bleu
    higher_is_better: true
  - metric: chrf
    aggregation: chrf
    higher_is_better: true
metadata:
  version: 1.0
""")


def task_name(version: str, direction: str) -> str:
    """The lm-eval task name, e.g. ``flores101_de-en``."""
    return f"{version}_{direction}"


def parse_task(task: str) -> tuple[str, str] | None:
    """(version, direction) of a Flores task name, or None for any other task."""
    version, _, direction = task.partition("_")
    if version in VERSIONS and direction in DIRECTIONS:
        return version, direction
    return None


def task_yaml(task: str, path: str) -> str:
    """The task YAML of Flores task ``task`` reading the dataset at ``path`` (hub id or folder)."""
    parsed = parse_task(task)
    if parsed is None:
        raise UserError(f"{task!r} is not a Flores task (known: {', '.join(all_tasks())})")
    source, target = parsed[1].split("-")
    return TASK_TEMPLATE.substitute(
        task=task, hooks=HOOKS, path=path, test_split=TEST_SPLIT, shot_split=SHOT_SPLIT,
        source_config=LANGUAGES[source][1], target_config=LANGUAGES[target][1],
        source_name=LANGUAGES[source][0], target_name=LANGUAGES[target][0], max_new_tokens=MAX_NEW_TOKENS)


def all_tasks() -> list[str]:
    """Every Flores task name."""
    return [task_name(v, d) for v in VERSIONS for d in DIRECTIONS]


# ---------------------------------------------------------------- loading (lm-eval's custom_dataset)


def _language_of(config: str) -> str:
    for name, flores_config in LANGUAGES.values():
        if flores_config == config:
            return name
    raise UserError(f"Flores config {config!r} is not one of {', '.join(c for _, c in LANGUAGES.values())}")


def join_rows(source_rows, target_rows, source: str, target: str) -> list[dict[str, Any]]:
    """Parallel docs from two languages' rows of one split, matched by ``id``."""
    targets = {row["id"]: row["sentence"] for row in target_rows}
    docs = []
    for row in source_rows:
        if row["id"] not in targets:
            raise UserError(f"Flores: sentence id {row['id']} of {source} has no {target} translation")
        docs.append({"id": row["id"], "source": row["sentence"], "target": targets[row["id"]],
                     "source_language": _language_of(source), "target_language": _language_of(target)})
    if not docs:
        raise UserError(f"Flores: no {source} sentences to translate")
    return docs


def load_flores(path: str, source: str, target: str, **_metadata):
    """lm-eval ``custom_dataset``: the ``dev`` and ``devtest`` splits of ``source`` -> ``target``
    (hub id or local folder in the same layout); other keyword arguments (task metadata) are ignored."""
    import datasets

    try:
        loaded = {config: datasets.load_dataset(path, config) for config in (source, target)}
    except Exception as err:  # datasets raises many kinds; one line for the user
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(f"cannot load Flores {source}/{target} from {path}: {first}") from None
    return datasets.DatasetDict({
        split: datasets.Dataset.from_list(join_rows(loaded[source][split], loaded[target][split], source, target))
        for split in (SHOT_SPLIT, TEST_SPLIT)})


# ---------------------------------------------------------------- the offline fixture (NOT Flores)

FIXTURE_NOTE = "ensemble-bench test fixture, NOT Flores"
# (English, German, Romanian), written for the tests; the first 6 are the ``dev`` split (shots).
FIXTURE: tuple[tuple[str, str, str], ...] = (
    ("The house is small.", "Das Haus ist klein.", "Casa este mică."),
    ("I drink water every morning.", "Ich trinke jeden Morgen Wasser.", "Beau apă în fiecare dimineață."),
    ("The train leaves at eight.", "Der Zug fährt um acht ab.", "Trenul pleacă la opt."),
    ("My sister lives in Berlin.", "Meine Schwester wohnt in Berlin.", "Sora mea locuiește în Berlin."),
    ("We are reading a book.", "Wir lesen ein Buch.", "Citim o carte."),
    ("The weather is nice today.", "Das Wetter ist heute schön.", "Vremea este frumoasă astăzi."),
    ("The dog sleeps in the garden.", "Der Hund schläft im Garten.", "Câinele doarme în grădină."),
    ("She buys bread at the market.", "Sie kauft Brot auf dem Markt.", "Ea cumpără pâine de la piață."),
    ("The children play football.", "Die Kinder spielen Fußball.", "Copiii joacă fotbal."),
    ("I do not understand the question.", "Ich verstehe die Frage nicht.", "Nu înțeleg întrebarea."),
    ("The museum opens at ten o'clock.", "Das Museum öffnet um zehn Uhr.", "Muzeul se deschide la ora zece."),
    ("He writes a letter to his mother.", "Er schreibt seiner Mutter einen Brief.",
     "El îi scrie o scrisoare mamei sale."),
    ("The river is very long.", "Der Fluss ist sehr lang.", "Râul este foarte lung."),
    ("We travel to the sea in summer.", "Im Sommer fahren wir ans Meer.", "Vara călătorim la mare."),
    ("The coffee is too hot.", "Der Kaffee ist zu heiß.", "Cafeaua este prea fierbinte."),
    ("The teacher explains the lesson.", "Der Lehrer erklärt die Lektion.", "Profesorul explică lecția."),
    ("My phone is on the table.", "Mein Telefon liegt auf dem Tisch.", "Telefonul meu este pe masă."),
    ("The shop is closed on Sunday.", "Der Laden ist am Sonntag geschlossen.", "Magazinul este închis duminica."),
    ("They eat soup for dinner.", "Sie essen Suppe zum Abendessen.", "Ei mănâncă supă la cină."),
    ("The city has many bridges.", "Die Stadt hat viele Brücken.", "Orașul are multe poduri."),
    ("I need a new bicycle.", "Ich brauche ein neues Fahrrad.", "Am nevoie de o bicicletă nouă."),
    ("The doctor works at the hospital.", "Der Arzt arbeitet im Krankenhaus.", "Medicul lucrează la spital."),
    ("The cat drinks milk.", "Die Katze trinkt Milch.", "Pisica bea lapte."),
    ("Our flight was late.", "Unser Flug hatte Verspätung.", "Zborul nostru a întârziat."),
    ("The students write an exam.", "Die Studenten schreiben eine Prüfung.", "Studenții dau un examen."),
    ("It is raining in the mountains.", "In den Bergen regnet es.", "Plouă în munți."),
    ("The apples are red and sweet.", "Die Äpfel sind rot und süß.", "Merele sunt roșii și dulci."),
    ("My grandfather tells old stories.", "Mein Großvater erzählt alte Geschichten.",
     "Bunicul meu spune povești vechi."),
    ("The bus stops in front of the school.", "Der Bus hält vor der Schule.", "Autobuzul oprește în fața școlii."),
    ("We will meet tomorrow evening.", "Wir treffen uns morgen Abend.", "Ne vom întâlni mâine seară."),
)
FIXTURE_SHOTS = 6


def build_fixture() -> dict[str, dict[str, list[dict[str, Any]]]]:
    """The fixture as ``facebook/flores``'s layout: config per language, ``dev`` / ``devtest``."""
    configs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for column, (_, config) in enumerate(LANGUAGES.values()):
        rows = [{"id": i + 1, "URL": "none", "domain": FIXTURE_NOTE, "topic": FIXTURE_NOTE,
                 "has_image": 0, "has_hyperlink": 0, "sentence": triple[column]}
                for i, triple in enumerate(FIXTURE)]
        configs[config] = {SHOT_SPLIT: rows[:FIXTURE_SHOTS], TEST_SPLIT: rows[FIXTURE_SHOTS:]}
    return configs
