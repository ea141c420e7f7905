"""Which generation requests sample, and with what: a row's ``SamplingPolicy`` (the recipe's seed and its
``sampling:`` override) read over each request's generation settings (lm-eval's ``gen_kwargs``).

lm-eval asks a task with ``repeats: n`` for n answers by passing the same request n times; the k-th time
a request (its context and settings) appears in a call is its repeat k, and draws from a generator of
its own (decoding/sampling.py ``request_generator``): n different samples, the same ones in every run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ensemble_bench.decoding.sampling import RequestSampling, SamplingOverride, SamplingParams, request_key
from ensemble_bench.errors import UserError

SETTINGS = ("do_sample", "temperature", "top_p", "top_k", "min_p")  # the gen_kwargs that say how a request samples
DEFAULT_SEED = 1234  # a recipe's default seed (recipe/schema.py, Recipe.seed), for a model made without a policy


@dataclass(frozen=True)
class SamplingPolicy:
    """How one row reads its requests' sampling settings: the recipe's ``seed`` and the ``sampling:``
    override that applies to the row (its method entry's over the recipe's), if any."""

    seed: int = DEFAULT_SEED
    override: SamplingOverride | None = None

    def params(self, gen_kwargs: dict[str, Any]) -> SamplingParams:
        """The settings a request decodes with: lm-eval's reading of its gen_kwargs, the override over them;
        UserError (one line) for a setting out of range or of the wrong type."""
        try:
            params = SamplingParams.from_gen_kwargs(gen_kwargs)
        except (ValidationError, TypeError, ValueError) as err:
            shown = {key: gen_kwargs[key] for key in SETTINGS if key in gen_kwargs}
            first = err.errors()[0] if isinstance(err, ValidationError) else {"loc": (), "msg": str(err)}
            where = ".".join(str(part) for part in first["loc"])
            raise UserError(f"generation settings {shown}: {where + ': ' if where else ''}{first['msg']}") from None
        return params if self.override is None else self.override.over(params)

    def assign(self, requests: Sequence[tuple[str, dict[str, Any]]]) -> list[RequestSampling | None]:
        """Per (context, gen_kwargs) request, what it draws with (None: greedy); the k-th occurrence of the
        same request in ``requests`` is its repeat k."""
        seen: Counter[str] = Counter()
        assigned: list[RequestSampling | None] = []
        for context, gen_kwargs in requests:
            params = self.params(gen_kwargs)
            if params.greedy:
                assigned.append(None)
                continue
            key = request_key(context, gen_kwargs)
            assigned.append(RequestSampling(params, self.seed, key, seen[key]))
            seen[key] += 1
        return assigned


def row_policy(recipe, row) -> SamplingPolicy:
    """A planned row's policy: the recipe's seed; its method entry's ``sampling:`` over the recipe's (a
    member alone: the recipe's)."""
    entry = recipe.ensembles[row.spec].sampling if row.spec is not None else None
    override = entry.merged(recipe.sampling) if entry is not None else recipe.sampling
    return SamplingPolicy(recipe.seed, override)


def applied_sampling(configs: dict[str, Any], policy: SamplingPolicy) -> dict[str, dict[str, Any]]:
    """What each generating task of a results file was decoded with (lm-eval's task ``configs`` as it
    records them, the row's policy over them): ``{"do_sample": false}``, or the settings with the seed and
    the samples drawn per request (the task's ``repeats``)."""
    applied = {}
    for task, config in configs.items():
        if not isinstance(config, dict) or config.get("output_type") != "generate_until":
            continue
        params = policy.params(config.get("generation_kwargs") or {})
        applied[task] = params.record() if params.greedy else {
            **params.record(), "seed": policy.seed, "repeats": config.get("repeats") or 1}
    return applied
