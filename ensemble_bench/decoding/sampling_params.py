"""What a request samples with (``SamplingParams``, as lm-eval's ``generation_kwargs`` say it), a
recipe's ``sampling:`` over it (``SamplingOverride``) and a request's settings with its seed
(``RequestSampling``): plain settings, importing no torch, so that a recipe validates without it. The
transforms, the generators and the draw: decoding/sampling.py."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


# --- what a request asks for ---------------------------------------------------------------------------
class SamplingParams(BaseModel):
    """How one request decodes, as lm-eval's ``generation_kwargs`` say it (``from_gen_kwargs``), with a
    recipe's ``sampling:`` applied over them (``SamplingOverride``). Greedy (``greedy``) unless
    ``do_sample`` and a temperature above 0, as lm-eval's own normalisation reads them."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)
    do_sample: bool = False
    temperature: float = Field(default=1.0, ge=0.0, description="0: greedy, as in lm-eval and transformers")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, description="0: no top-k")
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)

    @classmethod
    def from_gen_kwargs(cls, gen_kwargs: dict[str, Any]) -> SamplingParams:
        """lm-eval's reading (``lm_eval.models.utils.normalize_gen_kwargs``): a missing temperature is 0;
        a missing ``do_sample`` is true when the temperature is above 0; ``do_sample: false`` is greedy
        whatever the temperature. ValueError (one line) for a value out of range."""
        given = {key: gen_kwargs[key] for key in ("top_p", "top_k", "min_p") if gen_kwargs.get(key) is not None}
        temperature = float(gen_kwargs.get("temperature") or 0.0)
        do_sample = gen_kwargs.get("do_sample")
        do_sample = temperature > 0 if do_sample is None else bool(do_sample)
        return cls.model_validate({"do_sample": do_sample, "temperature": temperature,
                                   **{k: float(v) if k != "top_k" else int(v) for k, v in given.items()}},
                                  strict=False)

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature == 0

    def record(self) -> dict[str, Any]:
        """What a results file records: ``greedy``, or the settings drawn with."""
        if self.greedy:
            return {"do_sample": False}
        return self.model_dump()


class SamplingOverride(BaseModel):
    """A recipe's ``sampling:`` (a method entry's, else the recipe's): the settings it gives replace the
    task's own, for every generating request of the rows it applies to. ``do_sample: false`` decodes
    greedily whatever the task asks."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)
    do_sample: bool | None = None
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _says_something(self):
        if not self.model_fields_set:
            raise ValueError("give at least one of do_sample, temperature, top_p, top_k, min_p")
        return self

    def over(self, params: SamplingParams) -> SamplingParams:
        """``params`` with the settings given here; a temperature above 0 given without ``do_sample``
        samples (as in ``from_gen_kwargs``)."""
        given = self.model_dump(exclude_none=True)
        if "temperature" in given and "do_sample" not in given:
            given["do_sample"] = given["temperature"] > 0
        return params.model_copy(update=given)

    def merged(self, under: SamplingOverride | None) -> SamplingOverride:
        """This override over another (a method entry's over the recipe's)."""
        if under is None:
            return self
        return SamplingOverride(**{**under.model_dump(exclude_none=True), **self.model_dump(exclude_none=True)})


def request_key(context: str, gen_kwargs: dict[str, Any]) -> str:
    """A request's identity: SHA-256 of its context and generation settings (JSON with sorted keys),
    the same in every process (never Python's ``hash``)."""
    text = json.dumps([context, gen_kwargs], sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class RequestSampling:
    """What one generation request draws with: its settings and the seed of its generator."""

    params: SamplingParams
    seed: int
    key: str
    repeat: int = 0
