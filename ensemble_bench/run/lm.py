"""The lm-eval adapter: every method is an lm-eval ``LM`` registered under its own name.

This is the only module that imports lm-eval's model API. Requests arrive as lm-eval
``Instance`` objects and leave as the method's plain dataclasses; answers go back in order and
into lm-eval's response cache a chunk at a time (``cache_chunk``: an interrupted run resumes where it
stopped, with the numbers of a run that was never interrupted).

Chat templates differ per member, so lm-eval cannot render them: ``apply_chat_template``
returns the messages themselves (JSON behind a marker, with each member's SHA-256 of its rendering:
members/rendered.py) and each member renders them with its own template, or as plain text when it has none.

A generation request that samples (its gen_kwargs, or the row's ``sampling:``: decoding/request_sampling.py)
draws from a generator of its own, seeded by the recipe's seed, the request and its repeat index, so that a
sample does not depend on the chunk, the sitting or the replica that draws it. lm-eval keeps no cached
answer for such requests (every repeat is the same request), so ensbench keys each sample by request and
repeat in the same database (``SAMPLE_KIND``): a resumed run answers the samples it has and draws the rest,
the same samples an uninterrupted run draws.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from types import SimpleNamespace

from lm_eval.api.model import LM, hash_args

from ensemble_bench.decoding.method import NonFiniteScore
from ensemble_bench.decoding.request_sampling import SamplingPolicy, row_policy
from ensemble_bench.decoding.sampling import RequestSampling
from ensemble_bench.errors import UserError
from ensemble_bench.members.rendered import RenderedPrompts
from ensemble_bench.methods import Method, when_registered
from ensemble_bench.run import ranks as launcher
from ensemble_bench.run.answers import ANSWERS, CHAT_MARK, GENERATE, ScoringClock, located, tally
from ensemble_bench.run.build import MemberPool, build_from_model_args, build_method
from ensemble_bench.run.replicas import Joined, Located, ReplicaClock, Replicas
from ensemble_bench.run.sittings import resume_counts, save_counts, saved_counts, write_counts

SAMPLE_KIND = "generate_until/sample"  # a sampled answer's key in the response cache, beside lm-eval's own
SAMPLED_MARK = "ensbench-sampled:"  # + lm-eval's key of a sampled request lm-eval itself would cache (no do_sample)


def cache_chunk(hook, answered: list[tuple[str, tuple, object]]) -> None:
    """Put a chunk's answers into lm-eval's response cache in one SQL statement, so that a run
    interrupted or killed at any moment leaves all of the chunk cached or none of it. sqlite commits
    each statement of that cache on its own: written one by one (lm-eval's ``add_partial``), half a
    chunk could be kept, and the resumed run would batch the rest differently from the run that was
    never interrupted; a row's batch decides its padding, and the padding the last bit of its scores.
    The commit waits, so that a failed write surfaces here (cache_thread). Each answer is
    ``(kind, args, answer)`` under ``hash_args(kind, args)``; kind ``SAMPLED_MARK`` marks lm-eval's own key
    of a generation request's ``args`` (``EnsembleLM.set_cache_hook``). A hook without a database
    (caching off, a test's stand-in) gets the answers one by one."""
    dbdict = getattr(hook, "dbdict", None)
    if dbdict is None:
        for kind, args, answer in answered:
            if kind != SAMPLED_MARK:
                hook.add_partial(kind, args, answer)
        return

    def key(kind: str, args: tuple) -> str:
        return SAMPLED_MARK + hash_args(GENERATE, args) if kind == SAMPLED_MARK else hash_args(kind, args)

    values = [v for kind, args, answer in answered for v in (dbdict.encode_key(key(kind, args)), dbdict.encode(answer))]
    rows = ", ".join(["(?, ?)"] * len(answered))
    dbdict.conn.execute(f'REPLACE INTO "{dbdict.tablename}" (key, value) VALUES {rows}', values)
    dbdict.commit()


class EnsembleLM(LM):
    """An lm-eval model around one Method instance (members already loaded)."""

    method_name: str | None = None  # set on the per-method subclasses below
    # progress(label, examples done, examples in the pass, each per task) of a model made without one
    # (lm-eval's CLI sets it)
    default_progress: Callable[[str, dict[str, int], dict[str, int]], None] | None = None

    def __init__(self, method: Method, label: str,
                 progress: Callable[[dict[str, int], dict[str, int]], None] | None = None,
                 chunk_size: int | None = None, sampling: SamplingPolicy | None = None):
        super().__init__()
        self.method = method
        self.label = label
        self.sampling = sampling or SamplingPolicy()  # the recipe's seed and the row's sampling: override
        if progress is None and self.default_progress is not None:
            progress = functools.partial(self.default_progress, label)
        self.progress = progress
        self.chunk_size = chunk_size or max(1, method.batch_size)  # answers are cached per batch
        self.requests_computed = 0  # answered by the method in this process (not from the response cache)
        self.scoring = ScoringClock()
        self.rendered = RenderedPrompts()  # what each member made of the chat prompts
        self.after_chunk: Callable[[], None] | None = None  # the runner's: after a chunk's answers are cached
        self.busy_seconds = 0.0  # in the method's answers, in this process
        self.ranks: launcher.Ranks | None = None  # under torchrun / accelerate launch (run/ranks.py)
        self.rank_reports: list[dict] = []  # each rank's share, gathered on rank 0 with lm-eval's metrics

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> EnsembleLM:
        """``--model_args`` is JSON: {"members": [...], "method": {...}, "batch_size": n, "seed": n,
        "sampling": {...}, "replicas": n}."""
        try:
            data = json.loads(arg_string) if arg_string.strip() else {}
        except json.JSONDecodeError as err:
            raise UserError(f"--model_args must be JSON: {err}") from None
        return cls.create_from_arg_obj(data, additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> EnsembleLM:
        """lm-eval's ``batch_size`` (a number, ``auto``), ``max_batch_size`` and ``device`` come in
        ``additional_config`` (build.recipe_from_model_args says how they apply)."""
        extra = additional_config or {}
        recipe, row = build_from_model_args(dict(arg_dict), cls.method_name, extra)
        ranks = launcher.launched()
        if ranks is not None:
            recipe = launcher.placed_on_rank(recipe, ranks)
        policy = row_policy(recipe, row)
        if recipe.placement.replicas > 1:  # "replicas": n (run/replicas.py)
            lm = ReplicatedLM(Replicas(recipe), row.label, sampling=policy)
        else:
            lm = LM_CLASSES[row.method](build_method(recipe, row, MemberPool(recipe)), row.label, sampling=policy)
        if str(extra.get("batch_size")).startswith("auto"):
            lm.batch_sizes = {"auto": recipe.batch_size}  # lm-eval records the size 'auto' chose
        if ranks is not None:
            lm.join(ranks)
        return lm

    # --- lm-eval's ranks (torchrun, accelerate launch: run/ranks.py) ------------------------------------
    def join(self, ranks: launcher.Ranks) -> None:
        """This process answers the requests of rank ``ranks.rank``; lm-eval's collectives go over gloo."""
        launcher.connect(ranks)
        self.ranks, self._rank, self._world_size = ranks, ranks.rank, ranks.world_size
        if self.default_progress is not None:
            self.progress = functools.partial(self.default_progress,
                                              f"{self.label} (rank {ranks.rank} of {ranks.world_size})")

    @property
    def device(self):
        return "cpu"  # lm-eval's tensors of request counts: gloo carries CPU tensors

    def all_gather(self, tensor):
        return launcher.all_gather(tensor) if self.ranks else tensor

    def barrier(self) -> None:
        if self.ranks:
            launcher.barrier()

    def gather_object(self, obj, dst=0):
        """lm-eval's gather of metrics and samples, each rank's share of the work riding along."""
        if not self.ranks:
            return [obj]
        share = {"requests_computed": self.requests_computed, "busy_seconds": round(self.busy_seconds, 3)}
        gathered = launcher.gather_object((obj, share), dst)
        if gathered is None:
            return None
        self.rank_reports = [report for _, report in gathered]
        return [part for part, _ in gathered]

    def _ranks_info(self) -> dict:
        """timing.json's ``ranks``: each rank's requests and busy seconds, and how evenly they spread."""
        if not self.rank_reports:
            return {}
        busy = [report["busy_seconds"] for report in self.rank_reports]
        return {"ranks": {"count": len(busy), "requests_computed": [r["requests_computed"] for r in self.rank_reports],
                          "busy_seconds": busy,
                          "balance": round(sum(busy) / len(busy) / max(busy), 3) if max(busy) > 0 else 1.0,
                          "statistics_of": "rank 0"}}  # the method's and the scoring's counters beside it

    # --- lm-eval hooks ---------------------------------------------------------------------------
    @property
    def tokenizer_name(self) -> str:
        return "+".join(m.name for m in self.method.members)

    def chat_template(self, chat_template=False) -> str:
        return "per-member chat templates: " + ", ".join(
            f"{m.name}={'own' if m.uses_chat_template else 'plain'}"
            for m in self.method.members)

    def apply_chat_template(self, chat_history, add_generation_prompt: bool = True) -> str:
        return CHAT_MARK + json.dumps(self.rendered.record(self.method.members, chat_history), ensure_ascii=False)

    def get_model_info(self) -> dict:
        return {"ensbench": {"label": self.label, **self.method.info(), **self.scoring.summary(),
                             "members": [m.name for m in self.method.members], **self.rendered.info(),
                             **self._sampling_info(), **self._ranks_info()}}

    def _sampling_info(self) -> dict:
        override = self.sampling.override.model_dump(exclude_none=True) if self.sampling.override else None
        return {"sampling_seed": self.sampling.seed, "sampling_override": override}

    def set_cache_hook(self, cache_hook) -> None:
        """lm-eval's response cache for the pass about to start. A sampled request without ``do_sample``
        (sampling by its temperature, or by the row's ``sampling:``) is one lm-eval caches under its
        arguments: its cached answer would stand for every repeat. Those entries go (``SAMPLED_MARK``);
        the samples stay under their own keys (``SAMPLE_KIND``)."""
        super().set_cache_hook(cache_hook)
        dbdict = getattr(cache_hook, "dbdict", None)
        if dbdict is None:
            return
        marked = [key for (key,) in dbdict.conn.select(
            f'SELECT key FROM "{dbdict.tablename}" WHERE key LIKE ?', (SAMPLED_MARK + "%",))]
        if marked:  # the marks stay: lm-eval writes those entries again at the end of every pass
            gone = [(mark[len(SAMPLED_MARK):],) for mark in marked]
            dbdict.conn.executemany(f'DELETE FROM "{dbdict.tablename}" WHERE key = ?', gone)
            dbdict.commit()

    # --- requests -------------------------------------------------------------------------------
    def _run_in_chunks(self, kind: str, requests, convert=None, cached=None, apart=frozenset()) -> list:
        """Answer requests in chunks (longest first), caching each answer as soon as it exists: under
        lm-eval's key (``kind`` and the request's arguments), or ``cached(i, answer)``'s entries.
        ``convert(i)``: request i as ``ANSWERS[kind]`` takes it (default: its arguments); ``apart``: requests
        that share no chunk with the other requests of their context. A NaN or infinite score stops here,
        naming the benchmark's request (``_located``)."""
        answers: list = [None] * len(requests)
        examples = self._pass_started(requests)
        convert = convert or (lambda i: requests[i].args)
        for chunk in self._chunks(requests, apart):
            try:
                computed = self.answer(kind, [convert(i) for i in chunk])
            except NonFiniteScore as err:
                raise located(err, requests, chunk) from None
            self._chunk_done(kind, requests, chunk, computed, answers, examples, cached)
        return answers

    def _pass_started(self, requests) -> dict[str, int]:
        """The pass's examples per task (the choices of a question are one), shown to progress at once:
        they are known before the first batch ends."""
        examples = tally(requests, range(len(requests)))
        if self.progress:
            self.progress({}, examples)
        return examples

    def _chunk_done(self, kind: str, requests, chunk: list[int], computed: list, answers: list, examples,
                    cached=None) -> None:
        """A chunk's answers: kept, cached whole (``cache_chunk``), counted, shown to progress."""
        for i, answer in zip(chunk, computed):
            answers[i] = answer
        cache_chunk(self.cache_hook, [entry for i in chunk for entry in (
            cached(i, answers[i]) if cached else [(kind, requests[i].args, answers[i])])])
        self.requests_computed += len(chunk)
        if self.after_chunk:
            self.after_chunk()
        if self.progress:
            self.progress(tally(requests, chunk), examples)

    def answer(self, kind: str, batch: list[tuple]) -> list:
        """The method's answers to one chunk of requests of ``kind`` (run/answers.py says their form); a
        NaN or infinite score names this row (``of_row``)."""
        started = time.perf_counter()
        try:
            return ANSWERS[kind](self, batch)
        except NonFiniteScore as err:
            raise err.of_row(self.method, self.label) from None
        finally:
            self.busy_seconds += time.perf_counter() - started

    def _chunks(self, requests, apart=frozenset()) -> list[list[int]]:
        """Request indices in chunks, longest context first; requests sharing a context (the
        choices of one question) stay in one chunk, unless they are ``apart`` (the repeats of a sampled
        request: a chunk of the usual size is cached at a time)."""
        order = sorted(range(len(requests)), key=lambda i: (-len(requests[i].args[0]), requests[i].args[0]))
        chunks: list[list[int]] = []
        for i in order:
            same_context = (chunks and i not in apart
                            and requests[chunks[-1][-1]].args[0] == requests[i].args[0])
            if chunks and (same_context or len(chunks[-1]) < self.chunk_size):
                chunks[-1].append(i)
            else:
                chunks.append([i])
        return chunks

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        return self._evened(self._generate, requests)

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        return self._evened(functools.partial(self._run_in_chunks, "loglikelihood"), requests)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        return self._evened(functools.partial(self._run_in_chunks, "loglikelihood_rolling"), requests)

    def _evened(self, answer: Callable[[list], list], requests: list) -> list:
        """``answer(requests)``, but under a launcher's ranks lm-eval evens the ranks' request counts with
        copies of a rank's last request (the Instance passed again, past its ``repeats``): the copies get
        that request's own answers, in turn, and nothing is computed or drawn for them."""
        if self.ranks is None:
            return answer(requests)
        genuine: dict[int, list[int]] = {}  # an Instance's id -> the positions of its own repeats
        passed: dict[int, int] = {}  # an Instance's id -> the times it was passed so far
        own, copy_of = [], {}
        for i, request in enumerate(requests):
            seen = genuine.setdefault(id(request), [])
            passed[id(request)] = times = passed.get(id(request), 0) + 1
            if times <= (request.repeats or 1):
                seen.append(i)
                own.append(i)
            else:
                copy_of[i] = seen[(times - 1) % len(seen)]
        answered = dict(zip(own, answer([requests[i] for i in own])))
        return [answered[copy_of.get(i, i)] for i in range(len(requests))]

    def _generate(self, requests) -> list[str]:
        """Each request's text: greedy, or drawn as its settings and the row's ``sampling:`` say (a sample
        already in the response cache under its request and repeat is not drawn again)."""
        draws = self.sampling.assign([(r.args[0], dict(r.args[1] or {})) for r in requests])
        answers = _sampled_answers(self.cache_hook, requests, draws)
        todo = [i for i in range(len(requests)) if i not in answers]

        def cached(k: int, answer: str) -> list[tuple[str, tuple, object]]:
            request, drawn = requests[todo[k]], draws[todo[k]]
            if drawn is None:
                return [(GENERATE, request.args, answer)]
            entries = [(SAMPLE_KIND, _sample_args(request.args, drawn), answer)]
            if not (request.args[1] or {}).get("do_sample"):  # lm-eval caches it under its arguments
                entries.append((SAMPLED_MARK, request.args, True))
            return entries

        sampled = frozenset(k for k, i in enumerate(todo) if draws[i] is not None)
        computed = self._run_in_chunks(GENERATE, [requests[i] for i in todo],
                                       lambda k: (requests[todo[k]].args, draws[todo[k]]), cached, sampled)
        answers.update(zip(todo, computed))
        return [answers[i] for i in range(len(requests))]

    # --- what a row reports -----------------------------------------------------------------------
    def reported(self) -> dict:
        """The row's statistics for its timing.json: the method's, the requests computed, the scoring's."""
        return {**self.method.info(), "requests_computed": self.requests_computed, **self.scoring.summary()}

    def span_traces(self) -> list[dict]:
        """Span-level methods: candidates and scores per round, of the requests computed in this sitting."""
        return getattr(self.method, "traces", None) or []

    def carried(self) -> dict[str, object]:
        """The accumulators of the row's statistics carried across sittings (run/sittings.py)."""
        return {**self.method.carried(), "scoring": self.scoring}

    def carry_counts(self, db) -> None:
        """The row's statistics over all its sittings: the earlier sittings' counters are added before it
        computes anything, and the counters so far are written after every chunk of cached answers."""
        resume_counts(self.carried(), db)
        self.after_chunk = lambda: save_counts(self.carried(), db)  # the cuts looked at anew



def _sample_args(args: tuple, drawn: RequestSampling) -> tuple:
    """What a sample is cached under: the request, the settings it drew with, the seed and its repeat."""
    return (*args, drawn.params.record(), drawn.seed, drawn.repeat)


def _sampled_answers(hook, requests, draws: list[RequestSampling | None]) -> dict[int, str]:
    """The samples an earlier sitting cached (by request and repeat), by request index."""
    dbdict = getattr(hook, "dbdict", None)
    if dbdict is None:
        return {}
    found = {}
    for i, drawn in enumerate(draws):
        if drawn is not None and (key := hash_args(SAMPLE_KIND, _sample_args(requests[i].args, drawn))) in dbdict:
            found[i] = dbdict[key]
    return found


class ReplicatedLM(EnsembleLM):
    """The lm-eval model of a row whose ensemble runs in replicas: chunks go out, answers come back and
    are cached as one process caches them."""

    def __init__(self, replicas: Replicas, label: str, progress=None, sampling: SamplingPolicy | None = None):
        row = next(row for row in replicas.recipe.plan if row.label == label)
        described = replicas.begin(label, LM_CLASSES[row.method])
        members = [SimpleNamespace(name=name, uses_chat_template=chat) for name, chat in described["members"]]
        method = SimpleNamespace(members=members, batch_size=replicas.recipe.batch_size)
        super().__init__(method, label, progress=progress, sampling=sampling or row_policy(replicas.recipe, row))
        self.replicas = replicas
        self.joined = Joined(described["joins"])
        count = len(replicas.actors)
        self.clock = ReplicaClock([0.0] * count, [0] * count)
        self.passes = 0

    def apply_chat_template(self, chat_history, add_generation_prompt: bool = True) -> str:
        return self.replicas.call("render", chat_history)

    def _run_in_chunks(self, kind: str, requests, convert=None, cached=None, apart=frozenset()) -> list:
        answers: list = [None] * len(requests)
        examples = self._pass_started(requests)
        convert = convert or (lambda i: requests[i].args)
        chunks = self._chunks(requests, apart)
        started, self.passes = time.perf_counter(), self.passes + 1
        try:
            for replica, number, reply in self.replicas.answer(kind, [[convert(i) for i in c] for c in chunks]):
                self.clock.busy_seconds[replica] += reply["busy"]
                self.clock.batches[replica] += 1
                self.joined.counts[replica] = reply["counts"]
                self.joined.records[(self.passes, number)] = reply["records"]
                self.joined.traces[(self.passes, number)] = reply["traces"]
                self._chunk_done(kind, requests, chunks[number], reply["answers"], answers, examples, cached)
        except Located as err:
            raise located(err.err, requests, chunks[err.number]) from None
        finally:
            self.clock.wall_seconds += time.perf_counter() - started
        return answers

    def carry_counts(self, db) -> None:
        self.joined.earlier = saved_counts(db)
        self.after_chunk = lambda: write_counts(self.joined.snapshot(), db)

    def _report(self) -> dict:
        return self.replicas.call("report", self.joined.snapshot())

    def reported(self) -> dict:
        found = self._report()
        return {**found["info"], "requests_computed": self.requests_computed, **found["scoring"],
                "replicas": self.clock.summary()}

    def get_model_info(self) -> dict:
        found = self._report()
        return {"ensbench": {"label": self.label, **found["info"], **found["scoring"],
                             "members": [m.name for m in self.method.members], **found["rendered"],
                             **self._sampling_info(), "replicas": self.clock.summary()}}

    def span_traces(self) -> list[dict]:
        return [t for k in sorted(self.joined.traces) for t in self.joined.traces[k]]


# --- one registered lm-eval model per method, made when the method is registered ---------------------------
def lm_class_name(method_name: str) -> str:
    """The adapter class's name, its lm-eval "module:Class" target: ``gac`` -> ``GacLM``, ``byte_level`` ->
    ``ByteLevelLM``."""
    return "".join(part.capitalize() for part in method_name.split("_")) + "LM"


LM_CLASSES: dict[str, type[EnsembleLM]] = {}  # method name -> its lm-eval model, every registered method


def _make_lm_class(method: type[Method]) -> None:
    """The lm-eval model of a method being registered (``methods.when_registered``): kept in
    ``LM_CLASSES`` and as this module's attribute ``lm_class_name``, so that lm-eval's
    ``ensemble_bench.run.lm:GacLM`` target resolves, for methods registered after import too."""
    name = lm_class_name(method.name)
    made = type(name, (EnsembleLM,), {"method_name": method.name, "__module__": __name__,
                                      "__doc__": f"lm-eval model ``{method.name}``: an EnsembleLM of that method."})
    LM_CLASSES[method.name] = made
    globals()[name] = made


when_registered(_make_lm_class)


def register_all() -> None:
    """Register each method under its own lm-eval model name, as a lazy "module:Class" target;
    calling it again is harmless. Must run after ``lm_eval.models`` is imported (that import fills
    the registry first).
    """
    import lm_eval.models  # noqa: F401
    from lm_eval.api.registry import model_registry

    for name, cls in LM_CLASSES.items():
        if name in model_registry and model_registry.get(name) is cls:
            continue  # registered (and resolved) by an earlier call
        model_registry.register(name, target=f"{__name__}:{cls.__name__}")

