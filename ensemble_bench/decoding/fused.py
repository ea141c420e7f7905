"""A method's fused distribution is finite, or the row stops in one line.

The decode loop checks every member's next-token distribution before a method sees it
(``decode.check_distributions``). A method's fusion can still turn finite distributions into NaN with
arithmetic of its own: a division by a sum that rounds to 0 (CoRE's rbf filter at a ``core_beta`` so
small that ``1 - exp(-beta)`` is 0, its model weights when every member's consistency is 0, EVA's
share of the kept members), a log of 0. ``argmax`` then picks a token that means nothing and the run
ends with empty or random answers and exit 0. So every fusion passes through ``checked_fusion`` where
the method consumes it (its greedy choice, its draw, its teacher-forced score):

    finite  <=>  max_v q(v) is finite for every row

(``amax`` propagates NaN; +inf is its own maximum; a row of -inf log-probs has no finite value). One
reduction per call, on the fusion's device. A row that fails raises ``NonFiniteFusion``: the loop
names the request and the step (``decode.located``), run/lm.py the method, its parameters and the row of
the recipe (``of_row``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import torch

from ensemble_bench.decoding.method import Method, NonFiniteScore

FUSION_CAUSES = ("the members' distributions were finite, so the method's own arithmetic made it: change the "
                 "parameters named here (a value at the edge of its range, such as CoRE's core_beta near 0)")


class NonFiniteFusion(NonFiniteScore):
    """A method fused finite member distributions into a NaN or infinite one. ``row`` is the row of
    the method's ``choose`` (its live rows), then of the batch once the loop has ``located`` it."""

    def __init__(self, who: str = "the method", value: float = math.nan, step: str = "fusing its members",
                 excerpt: str = "", **parts):
        super().__init__(who, value, step, excerpt, **parts)

    @staticmethod
    def message(who, value, step, excerpt, where, **_) -> str:
        request = f", for request{where}: {excerpt}" if excerpt or where else ""
        return f"{who} gave a non-finite fused distribution ({value}) {step}{request}; {FUSION_CAUSES}"

    def of_row(self, method: Method, label: str) -> NonFiniteFusion:
        """The fault naming the recipe's row, the method and the parameters the recipe set."""
        params = method.params
        given = params.model_dump(mode="json", include=params.model_fields_set)
        shown = ", ".join(f"{name}: {json.dumps(value)}" for name, value in sorted(given.items()))
        return self.with_(who=f"row '{label}': method {method.name} ({shown or 'default parameters'})")


def checked_fusion(fused: torch.Tensor, rows: Sequence[int] | None = None) -> torch.Tensor:
    """``fused`` [rows, C] (probabilities or log-probabilities) as given when every row's largest
    value is finite; else NonFiniteFusion for the first row that is not. ``rows``: the ``choose`` row
    of each row of ``fused`` when it holds some rows only (default: the same order)."""
    top = fused.amax(dim=-1)
    finite = torch.isfinite(top)
    if bool(finite.all()):
        return fused
    k = int((~finite).nonzero()[0, 0])
    raise NonFiniteFusion(value=float(top[k]), row=k if rows is None else rows[k])
