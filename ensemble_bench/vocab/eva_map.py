"""EVA's cross-model vocabulary alignment (Xu et al., NAACL 2024, Sec. 3.1): pure functions over
two vocabularies and their output embeddings, no models.

1. Seed dictionary: the tokens both vocabularies hold (same bytes; special tokens by their text).
2. Mapping: the supervised embedding mapping of Artetxe et al. (2018) that the authors run through
   VecMap (``--supervised``): unit length, centring, unit length; whitening on the seed pairs; the
   orthogonal map from the SVD of their cross-covariance; re-weighting by the singular values
   (power 0.5, both sides); de-whitening each side by its own whitening.
3. Similarity: CSLS between every auxiliary token and every lead token, as the authors' retrieval
   script writes it: ``2 cos(x, z) - r_T(z)``, ``r_T(z)`` the mean cosine of lead token z to its
   ``neighborhood`` nearest auxiliary tokens (the source term r_S(x) of full CSLS is left out;
   it does not change a row's ranking, and the threshold below is set on these values).
4. Noise reduction, per auxiliary token: its ``top_t`` lead tokens; those below ``threshold``
   dropped; the whole row dropped when more than 5 remain whose scores spread less than
   ``variance`` (standard deviation: a token near everything means nothing).

The result is a sparse map M (aux id -> lead ids, weights = the scores kept); a projected
distribution is p_aux M (Sec. 3.2). Steps 3-4 are vocab/csls.py: one pass over the products, in chunks
of auxiliary rows reduced at once, never a dense |V_aux| x |V_lead| matrix. Stop ids map to the lead's
stop id with the same text (else its lowest) with weight 1; other special tokens map nowhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ensemble_bench.vocab.bytes_view import VocabView
from ensemble_bench.vocab.csls import CslsParams, Report, similarity_map

BLOCK_ROWS = 16384  # rows squared at once when normalising (16k x 896 x 4 bytes = 59 MB)



@dataclass(frozen=True)
class AlignParams(CslsParams):
    """The alignment's parameters (EVA Sec. 3.1 and the authors' defaults): the similarity's, and the overlap."""

    overlap: str = "learned"  # "learned": every token through the similarity; "direct": shared tokens map to themselves


@dataclass(frozen=True)
class VocabProjection:
    """M for one auxiliary member: ``src[k] -> dst[k]`` with ``weight[k]`` (sparse, aux -> lead)."""

    src: torch.Tensor     # [n] auxiliary ids
    dst: torch.Tensor     # [n] lead ids
    weight: torch.Tensor  # [n] float32
    lead_size: int
    seeds: int            # overlapping tokens the mapping was learned from

    def project(self, probs: torch.Tensor) -> torch.Tensor:
        """p_aux M: auxiliary probabilities [rows, V_aux] -> the lead's space [rows, V_lead] (Sec. 3.2)."""
        device = probs.device
        out = torch.zeros((probs.shape[0], self.lead_size), dtype=probs.dtype, device=device)
        taken = probs.index_select(1, self.src.to(device)) * self.weight.to(device, probs.dtype)
        return out.index_add_(1, self.dst.to(device), taken)


def _first_ids(view: VocabView, ids) -> dict[bytes, int]:
    """Bytes -> the lowest of ``ids`` holding them."""
    found: dict[bytes, int] = {}
    for token_id in ids:
        piece = view.pieces[token_id]
        if piece:
            found.setdefault(piece, token_id)
    return found


def seed_pairs(aux: VocabView, lead: VocabView) -> tuple[np.ndarray, np.ndarray]:
    """The overlapping tokens (the seed dictionary): text tokens with the same bytes, and special
    tokens with the same text, as (aux ids, lead ids) in the auxiliary's id order."""
    lead_text = _first_ids(lead, lead.text_ids())
    lead_special = _first_ids(lead, sorted(lead.special_ids))
    pairs = []
    for piece, token_id in _first_ids(aux, aux.text_ids()).items():
        if piece in lead_text:
            pairs.append((token_id, lead_text[piece]))
    for piece, token_id in _first_ids(aux, sorted(aux.special_ids)).items():
        if piece in lead_special:
            pairs.append((token_id, lead_special[piece]))
    pairs.sort()
    return np.array([a for a, _ in pairs], dtype=np.int64), np.array([b for _, b in pairs], dtype=np.int64)


def _unit(matrix: np.ndarray) -> np.ndarray:
    """``matrix``'s rows scaled to unit length, in place (a row of zeros stays so)."""
    norms = np.empty(len(matrix), dtype=matrix.dtype)
    for start in range(0, len(matrix), BLOCK_ROWS):  # the squares of a block at a time, not of the whole matrix
        norms[start:start + BLOCK_ROWS] = np.sqrt((matrix[start:start + BLOCK_ROWS] ** 2).sum(axis=1))
    norms[norms == 0] = 1
    matrix /= norms[:, None]
    return matrix


def _normalised(matrix: np.ndarray) -> np.ndarray:
    """A copy at unit length, centred, at unit length (VecMap's ``--supervised`` normalisation)."""
    matrix = _unit(np.array(matrix, dtype=np.float32))
    matrix -= matrix.mean(axis=0)
    return _unit(matrix)


def _whitening(matrix: np.ndarray) -> np.ndarray:
    _, s, vt = np.linalg.svd(matrix, full_matrices=False)
    return vt.T.dot(np.diag(1 / s)).dot(vt)


def supervised_mapping(x: np.ndarray, z: np.ndarray, src: np.ndarray, trg: np.ndarray,
                       report: Report | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Both embedding matrices mapped into one space from the seed pairs ``x[src[k]] ~ z[trg[k]]``
    (Artetxe et al. 2018: whiten, orthogonal map, re-weight, de-whiten). Members of different
    widths meet in min(d_x, d_z) dimensions (a thin SVD; the authors' full one needs equal widths).
    Each step replaces the one before it (at most two |V_lead| x d matrices at once)."""
    step = (lambda done: report("mapping", done / 4)) if report else (lambda done: None)
    step(0)
    x, z = _normalised(x), _normalised(z)
    wx1, wz1 = _whitening(x[src]), _whitening(z[trg])
    step(1)
    x = x.dot(wx1)
    z = z.dot(wz1)
    wx2, s, wz2_t = np.linalg.svd(x[src].T.dot(z[trg]), full_matrices=False)
    wz2, root = wz2_t.T, s ** 0.5
    step(2)
    x = x.dot(wx2)
    x *= root
    z = z.dot(wz2)
    z *= root
    step(3)
    x = x.dot(wx2.T.dot(np.linalg.inv(wx1)).dot(wx2))
    z = z.dot(wz2.T.dot(np.linalg.inv(wz1)).dot(wz2))
    step(4)
    return x, z


def stop_targets(aux: VocabView, lead: VocabView, aux_stops: Sequence[int],
                 lead_stops: Sequence[int]) -> dict[int, int]:
    """Each auxiliary stop id -> the lead's stop id with its text, else the lead's lowest stop id."""
    if not lead_stops:
        return {}
    by_text = _first_ids(lead, sorted(lead_stops))
    return {s: by_text.get(aux.pieces[s] or b"", min(lead_stops)) for s in aux_stops}


def build_projection(aux: VocabView, lead: VocabView, aux_embeddings, lead_embeddings, aux_stops: Sequence[int],
                     lead_stops: Sequence[int], params: AlignParams, report: Report | None = None) -> VocabProjection:
    """M for one auxiliary member (steps 1-4, see the module docstring); ``report(stage, fraction)``
    hears the progress of the two long steps (mapping, similarity)."""
    src, trg = seed_pairs(aux, lead)
    if len(src) < 2:
        raise ValueError(f"the vocabularies share {len(src)} tokens: EVA learns its mapping from shared tokens")
    x = np.asarray(aux_embeddings, dtype=np.float32)[:aux.size]
    z = np.asarray(lead_embeddings, dtype=np.float32)[:lead.size]
    xw, zw = supervised_mapping(x, z, src, trg, report)
    stops = stop_targets(aux, lead, aux_stops, lead_stops)
    text = np.array([i for i in aux.text_ids() if i not in stops], dtype=np.int64)
    direct: dict[int, int] = {}
    if params.overlap == "direct":
        texts = set(text.tolist())
        direct = {a: b for a, b in zip(src.tolist(), trg.tolist()) if a in texts}
        text = np.array([i for i in text.tolist() if i not in direct], dtype=np.int64)
    excluded = sorted(i for i in lead.special_ids | {i for i, p in enumerate(lead.pieces) if p is None})
    a, b, w = similarity_map(_unit(xw), _unit(zw), text, params, excluded, report)
    fixed = {**direct, **stops}
    a = np.concatenate([a, np.array(list(fixed), dtype=np.int64)])
    b = np.concatenate([b, np.array(list(fixed.values()), dtype=np.int64)])
    w = np.concatenate([w, np.ones(len(fixed), dtype=np.float32)])
    order = np.lexsort((b, a))
    return VocabProjection(torch.from_numpy(a[order]), torch.from_numpy(b[order]), torch.from_numpy(w[order]),
                           lead.size, len(src))
