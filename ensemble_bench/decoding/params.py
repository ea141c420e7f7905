"""What a method declares, apart from its work: its parameters (``MethodParams``, validated from a
recipe's ``method`` block) and the facts a recipe is checked against (``MethodSpec``: member counts,
the lead member's field, whether it samples, the packages and models it needs). Imports no torch, so
that validating a recipe (``ensbench run --dry-run``, ``ensbench list``) loads no model code; the
method's work (``decoding/method.Method``) extends its declaration."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from ensemble_bench.errors import UserError

AUTO = "auto"  # a proposer learned while decoding (speculative decoding)
Retokenize = Literal["local", "canonical"]  # how a member takes text it did not choose (docs/retokenize.md)
EQUAL_WEIGHTS_ALIAS = "average"  # recipes may say ``weights: average`` for equal weights (None)


class MethodParams(BaseModel):
    """A method's hyper-parameters, validated from the recipe's ``method`` block. Every float, in
    lists too (weights, scores), must be finite: NaN and +-inf are refused (``allow_inf_nan``).

    Stored (``model_dump``) by their serialization names (SweetSpan's ``lambda``); read by their
    names or the papers' aliases (``lead_field``). The lead member's parameter remembers how the
    recipe spelled it (``lead_spelling``), so that an error about it names the recipe's word."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False,
                              validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)
    _lead_spelling: str = PrivateAttr(default="lead")

    @model_validator(mode="before")
    @classmethod
    def _equal_weights_alias(cls, data: Any) -> Any:
        """``weights: average`` (the papers' word) is equal weights, spelled None in code."""
        if isinstance(data, dict) and "weights" in cls.model_fields and data.get("weights") == EQUAL_WEIGHTS_ALIAS:
            return {**data, "weights": None}
        return data

    @model_validator(mode="wrap")
    @classmethod
    def _remember_lead_spelling(cls, data: Any, handler):
        params = handler(data)
        lead = cls.model_fields.get("lead")
        if isinstance(data, dict) and lead is not None and isinstance(lead.validation_alias, AliasChoices):
            spelled = [name for name in lead.validation_alias.choices if isinstance(name, str) and name in data]
            params._lead_spelling = spelled[0] if spelled else "lead"
        return params

    @property
    def lead_spelling(self) -> str:
        """The recipe's word for the lead member (``lead`` or a paper's alias such as ``primary``)."""
        return self._lead_spelling


def lead_field(default: int | str | None, meaning: str, *aliases: str):
    """The lead member's parameter: ``lead`` in code, the papers' names accepted in recipes."""
    return Field(default=default, validation_alias=AliasChoices("lead", *aliases),
                 description=f"{meaning}; a member index or name" + (f" (recipes may also say {', '.join(aliases)})"
                                                                     if aliases else ""))


class WindowParams(MethodParams):
    """The parameter shared by every method whose members take text they did not choose."""

    window: int = Field(default=4, ge=0, le=64, description="look-behind tokens when a member re-tokenises "
                        "text it did not choose (local re-tokenisation)")


def resolve_member(value: int | str, labels: Sequence[str], field_name: str) -> int:
    """A member named by index or label in a method parameter -> its index (UserError if none)."""
    if isinstance(value, str):
        if value not in labels:
            raise UserError(f"method.{field_name}: '{value}' is not a member (members: {', '.join(labels)})")
        return list(labels).index(value)
    if not 0 <= value < len(labels):
        raise UserError(f"method.{field_name}: index {value} out of range for {len(labels)} members")
    return value


FLOAT32_MAX = 3.4028234663852886e38  # weights become float32 tensors: a larger sum would be inf


FLOAT32_TINY = 1.1754943508222875e-38  # float32's smallest normal number


def weights_problem(weights: Sequence[float]) -> str | None:
    """Why per-member weights cannot be used (not finite, negative, a sum of zero, below float32's
    smallest normal number or beyond float32), or None. Weights become float32 tensors and the
    logarithm of their sum is taken: ``[1e-320, 1e-320]`` would reach ``log(0)`` after the members'
    rows are computed. A single weight that underflows to 0 beside others (``[1e-300, 1]``) is a
    zero weight, as ``[0, 1]`` is."""
    total = math.fsum(weights)
    if not all(math.isfinite(w) and w >= 0 for w in weights) or not 0 < total <= FLOAT32_MAX:
        return f"weights must be >= 0 and finite, with a positive sum of at most {FLOAT32_MAX:.3g}"
    if total < FLOAT32_TINY:
        return (f"their sum ({total:.3g}) must be at least {FLOAT32_TINY:.3g}, float32's smallest normal number "
                "(smaller weights are 0 in float32): scale the weights up")
    return None


def checked_weights(value: list[float] | None) -> list[float] | None:
    """A ``weights`` field's check (``Annotated[..., AfterValidator(checked_weights)]``): None, or usable weights."""
    if value is not None and (problem := weights_problem(value)) is not None:
        raise ValueError(problem)
    return value


def normalised_weights(weights: Sequence[float], count: int) -> list[float]:
    """Explicit per-member weights, checked and scaled to sum to 1."""
    if len(weights) != count:
        raise UserError(f"method.weights: expected {count} values (one per member), got {len(weights)}")
    if (problem := weights_problem(weights)) is not None:
        raise UserError(f"method.weights: {problem}, got {list(weights)}")
    return [w / sum(weights) for w in weights]



def check_lead_and_weights(params: MethodParams, labels: Sequence[str]) -> None:
    """UserError unless the lead member (``params.lead``) is one of ``labels`` and the explicit weights, if
    any (``params.weights``), are one valid value per member."""
    resolve_member(params.lead, labels, params.lead_spelling)
    if params.weights is not None:
        normalised_weights(params.weights, len(labels))

class SpeculativeParams(MethodParams):
    """The parameters of draft-and-verify decoding, shared by every method that supports it."""

    speculative: int = Field(default=0, ge=0, le=64, description=(
        "0: every-token decoding; N: a proposer drafts up to N tokens and the ensemble verifies them in one "
        "forward pass per member, with the same greedy output (docs/speculative.md)"))
    proposer: int | str | None = Field(default=None, description=(
        "the member that drafts: an index or name, auto (the best agreement per cost, learned while decoding), "
        "or null (the lead member)"))


def resolve_proposer(params: SpeculativeParams, labels: Sequence[str], lead: int) -> int | None:
    """The proposer's index (None: auto)."""
    if params.proposer == AUTO:
        return None
    return lead if params.proposer is None else resolve_member(params.proposer, labels, "proposer")


class MethodSpec:
    """A method's declaration: its recipe name, its ``Params`` and the facts a recipe is checked
    against before anything loads. ``implementation`` ("module:Class") names the class that does the
    work (a subclass of ``decoding/method.Method`` and of this declaration); the registry imports it
    only when a row is built (``ensemble_bench.methods.get_method``)."""

    implementation: ClassVar[str | None] = None
    family: ClassVar[str | None] = None  # the docs page of its family: docs/methods/<family>.md
    name: ClassVar[str]
    Params: ClassVar[type[MethodParams]] = MethodParams
    min_members: ClassVar[int] = 1
    max_members: ClassVar[int | None] = None
    alone: ClassVar[bool] = False  # a member alone (one row per member), not an ensemble
    samples: ClassVar[bool] = False  # can draw from its distribution when a request samples (decoding/sampling.py)
    retired: ClassVar[dict[str, Any]] = {}  # parameters it no longer has -> the value that meant what it does now
    lead_param: ClassVar[str | None] = None  # the Params field naming the lead member (``lead``), if any
    version: ClassVar[int] = 1  # raise it when a change alters the method's outputs: its finished rows are not reused
    # how the method scores a multiple-choice option where some of its parameters play no part, and those
    # parameters: the plan names any that a row sets when its recipe has multiple-choice tasks
    choice_scoring: ClassVar[str] = ""
    inert_on_choices: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def takes_weights(cls) -> bool:
        """Whether the method combines members with per-member weights (``weights`` parameter)."""
        return "weights" in cls.Params.model_fields

    @classmethod
    def speculative_sampling_problem(cls, params: MethodParams) -> str | None:
        """Why a row with these parameters and ``speculative: N`` cannot sample (the end of a sentence
        after the method's name), or None where it samples speculatively (decoding/speculative_sampling.py)."""
        return "with speculative decodes greedily only"

    @classmethod
    def packages(cls, params: MethodParams) -> dict[str, str]:
        """Optional packages these parameters need (import name -> what to pip install); the preflight checks them."""
        return {}

    @classmethod
    def models(cls, params: MethodParams) -> tuple[str, ...]:
        """Models these parameters load besides the members (a scorer); the preflight checks them."""
        return ()

    @classmethod
    def unused_on_choices(cls, params: MethodParams) -> list[str]:
        """The parameters ``params`` sets away from their defaults that play no part in scoring a
        multiple-choice option (``inert_on_choices``), in field order."""
        given, defaults = params.model_dump(mode="json"), cls.Params().model_dump(mode="json")
        return [name for name in cls.Params.model_fields
                if name in cls.inert_on_choices and given.get(name) != defaults.get(name)]

    @classmethod  # noqa: B027 (an optional hook: most methods need no member checks)
    def check_members(cls, params: MethodParams, labels: Sequence[str]) -> None:
        """Checks that need the member list (counts of weights, gate names); raise UserError."""
