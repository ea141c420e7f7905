"""EVA's similarity and noise reduction (vocab/eva_map.py, steps 3-4) from one pass over the products.

Every auxiliary token x is scored against every lead token z by CSLS as the authors' retrieval script
writes it, ``2 cos(x, z) - r_T(z)``, where the hubness ``r_T(z)`` is the mean of z's ``neighborhood``
largest cosines to the auxiliary tokens; each row keeps its ``top_t`` best scores, those below
``threshold`` dropped, and the whole row dropped when more than ``CROWDED`` remain whose scores spread
(standard deviation) no more than ``variance``.

r_T needs every product before any score is final, so the direct computation passes twice over the
|V_aux| x |V_lead| x d products (once for r_T, once for the scores): nearly all of the map's cost.
Here the products are made once, a chunk of auxiliary rows at a time:

- r_T is kept as a running value over the rows seen so far, ``h(z) <= r_T(z)``, so
  ``2 cos(x, z) - h(z)`` bounds the final score from above;
- each row keeps the ``KEPT`` lead tokens of highest bound, their cosines, and the lowest of those
  bounds ``b``: no token left out can score more than ``b``;
- when r_T is final, the kept tokens are scored exactly. The row's top-t is the one the direct
  computation finds when its t-th score is above ``b`` (or ``b`` is below the threshold, so that no
  token left out could be kept) and does not tie the next one; any other row is scored again
  against every lead token (a few rows, the first chunks' mostly, while h is still low).

The cosines are the same matrix products, chunk for chunk, as the direct computation's, the scores
the same operations on them, so the map is the same (tests/methods/test_eva.py compares both).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

CHUNK_ROWS = 256  # auxiliary rows scored at once: 256 x 152k lead tokens x 4 bytes = 156 MB (two such buffers)
CROWDED = 5  # the variance cut applies to rows keeping more than this many tokens (the authors' rule)
KEPT = 32    # lead tokens a row keeps from the pass (at least top_t + 1)
Report = Callable[[str, float], None]  # (stage, fraction done): progress while the map is learned


@dataclass(frozen=True)
class CslsParams:
    """The similarity's parameters (EVA Sec. 3.1 and the authors' defaults)."""

    top_t: int = 10
    threshold: float = 0.1
    variance: float = 0.01
    neighborhood: int = 1


def kept_scores(values: torch.Tensor, threshold: float, variance: float) -> torch.Tensor:
    """[rows, t] mask of the scores a row keeps: those >= threshold, none when more than ``CROWDED``
    remain with a standard deviation <= ``variance``."""
    keep = values >= threshold
    count = keep.sum(dim=1)
    kept = torch.where(keep, values, 0.0)
    mean = kept.sum(dim=1) / count.clamp(min=1)
    spread = (torch.where(keep, (values - mean[:, None]) ** 2, 0.0).sum(dim=1) / count.clamp(min=1)).sqrt()
    crowded = (spread <= variance) & (count > CROWDED)
    return keep & ~crowded[:, None]


class Hubness:
    """r_T over the auxiliary rows seen so far: each lead token's ``k`` largest cosines (running)."""

    def __init__(self, lead_size: int, k: int):
        self.top = torch.full((k, lead_size), -math.inf)

    def add(self, cosines: torch.Tensor) -> None:
        if self.top.shape[0] == 1:
            torch.maximum(self.top[0], cosines.max(dim=0).values, out=self.top[0])
        else:
            self.top = torch.cat([self.top, cosines]).topk(self.top.shape[0], dim=0).values

    def value(self) -> torch.Tensor:
        """The mean of the k largest (a row per lead token, summed as the direct computation sums them)."""
        return self.top.T.contiguous().mean(dim=1)


def _chunks(rows: torch.Tensor) -> list[torch.Tensor]:
    return [rows[start:start + CHUNK_ROWS] for start in range(0, len(rows), CHUNK_ROWS)]


def similarity_map(x: np.ndarray, z: np.ndarray, rows: np.ndarray, params: CslsParams, excluded: Sequence[int] = (),
                   report: Report | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(aux ids, lead ids, scores) of every pair auxiliary ``rows`` keep; ``x``, ``z`` unit rows. r_T runs
    over every auxiliary row; ``excluded`` lead ids are never a target (special tokens, padded rows)."""
    xs, zs = torch.from_numpy(x), torch.from_numpy(z)
    rows_t = torch.from_numpy(rows)
    blocked = torch.zeros(zs.shape[0], dtype=torch.bool)
    blocked[list(excluded)] = True
    top_t, kept = min(params.top_t, zs.shape[0]), min(max(KEPT, params.top_t + 1), zs.shape[0])
    hubness = Hubness(zs.shape[0], min(params.neighborhood, xs.shape[0]))
    others = torch.from_numpy(np.setdiff1d(np.arange(xs.shape[0]), rows))
    cosines = torch.empty((min(CHUNK_ROWS, xs.shape[0]), zs.shape[0]))
    bounds = torch.empty_like(cosines)
    ids, cos, lowest = (torch.empty((len(rows), kept), dtype=torch.long), torch.empty((len(rows), kept)),
                        torch.empty(len(rows)))
    chunks = [(None, c) for c in _chunks(others)] + list(enumerate(_chunks(rows_t)))
    if report:
        report("similarity", 0.0)
    for done, (index, chunk) in enumerate(chunks):
        block = torch.matmul(xs[chunk], zs.T, out=cosines[:len(chunk)])
        hubness.add(block)
        if index is not None:  # a row to score: its kept tokens' bounds under the running r_T
            at = slice(index * CHUNK_ROWS, index * CHUNK_ROWS + len(chunk))
            bound = torch.mul(block, 2, out=bounds[:len(chunk)]).sub_(hubness.value()).masked_fill_(blocked, -math.inf)
            values, ids[at] = bound.topk(kept, dim=1)
            cos[at], lowest[at] = block.gather(1, ids[at]), values[:, -1]
        if report:
            report("similarity", (done + 1) / len(chunks))
    hub = hubness.value().masked_fill_(blocked, math.inf)
    values, order = (2 * cos - hub[ids]).topk(top_t + (top_t < kept), dim=1)
    exact = _exact(values, lowest, top_t, params.threshold)
    targets = ids.gather(1, order[:, :top_t])
    src, dst, score = _kept_pairs(rows_t[exact], targets[exact], values[exact, :top_t], params)
    again = rows_t[~exact]
    if len(again):
        more = _rescored(xs, zs, again, hub, top_t, params, report)
        src, dst, score = (torch.cat([a, b]) for a, b in zip((src, dst, score), more))
    return src.numpy(), dst.numpy(), score.numpy()


def _exact(values: torch.Tensor, lowest: torch.Tensor, top_t: int, threshold: float) -> torch.Tensor:
    """[rows] whether a row's top-t among its kept tokens is its top-t among all lead tokens (module
    docstring): its t-th score above every score left out, or every score left out below the threshold;
    and no tie at the t-th place that the direct computation could break another way."""
    kth = values[:, top_t - 1]
    beaten = (lowest < kth) | (lowest < threshold)
    if values.shape[1] > top_t:
        beaten &= ~((values[:, top_t] == kth) & (kth >= threshold))
    return beaten


def _kept_pairs(rows: torch.Tensor, targets: torch.Tensor, values: torch.Tensor,
                params: CslsParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    keep = kept_scores(values, params.threshold, params.variance)
    return rows[:, None].expand_as(targets)[keep], targets[keep], values[keep]


def _rescored(xs: torch.Tensor, zs: torch.Tensor, rows: torch.Tensor, hub: torch.Tensor, top_t: int,
              params: CslsParams, report: Report | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The direct computation for ``rows``: every lead token scored. A lone row goes with a neighbour (a
    one-row product takes another BLAS path, whose rounding differs) that is then left out."""
    found = []
    chunks = _chunks(rows)
    if report:
        report(f"{len(rows)} rows scored again", 0.0)
    for done, chunk in enumerate(chunks):
        padded = torch.cat([chunk, rows[:1] if len(rows) > 1 else chunk]) if len(chunk) == 1 else chunk
        scores = 2 * (xs[padded] @ zs.T) - hub
        values, targets = scores[:len(chunk)].topk(top_t, dim=1)
        found.append(_kept_pairs(chunk, targets, values, params))
        if report:
            report(f"{len(rows)} rows scored again", (done + 1) / len(chunks))
    return tuple(torch.cat(parts) for parts in zip(*found))
