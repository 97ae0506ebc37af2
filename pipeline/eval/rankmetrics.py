"""Rank agreement between a benchmark's ranking of reward models and their downstream
ranking: Spearman's rho, weighted Kendall tau, NDCG and rank-biased overlap (RBO), each
computed on a batch of resamples at once (one row per resample, one column per model).

``x`` is the benchmark's figure per model (its accuracy: higher ranks first), ``y`` the
downstream score (higher is better). A figure is NaN where it is undefined.

- **Spearman's rho**: Pearson's r of the average ranks (as ``scipy.stats.spearmanr``).
- **Weighted Kendall tau** (Vigna 2015, the additive hyperbolic index ``scipy.stats.
  weightedtau`` computes by default): every pair of models ``i, j`` weighs
  ``1/(r_i + 1) + 1/(r_j + 1)``, where ``r`` is a model's position (from 0) when models are
  sorted by ``(x, y)`` decreasing; tau is the weighted sum of ``sign(x_i - x_j) *
  sign(y_i - y_j)`` over the weighted norms of the pairs not tied in x and not tied in y,
  and the figure is the mean of that index with the order by ``(x, y)`` and by ``(y, x)``.
  Undefined when x or y is constant.
- **NDCG**: models placed by x, highest first; a model's gain is its downstream rank from
  the bottom (its average rank by y, minus 1: the worst model gains 0, ties share); the
  discount at position ``p`` (from 1) is ``1 / log2(p + 1)``, and models tied in x share
  the mean discount of the positions they span (the expected DCG over every order of the
  tie). NDCG is that DCG over the DCG of the ideal order (gains sorted decreasing).
- **RBO** (Webber, Moffat and Zobel 2010, the extrapolated ``RBO_ext`` of two complete
  rankings of the same models): with ``A_d`` the share of the top ``d`` of one ranking found
  in the top ``d`` of the other, ``RBO = A_n p^n + (1 - p) * sum_{d=1..n} A_d p^(d-1)``,
  ``p`` the persistence (the weight of the top ``d`` ranks is ``1 - p^d``; 0.9 puts 65% of
  it on the top 10). Both rankings are decreasing (x for the benchmark, y downstream);
  ties are broken uniformly at random, independently in each ranking, and the figure is
  the expected RBO over those draws, computed exactly: a model in a tied block that
  straddles depth ``d`` is in the top ``d`` with probability (places left in the top ``d``)
  / (block size). Identical rankings give 1.

Every metric is undefined (NaN) when either side is the same for every model: there is no
ranking to compare (a random tie break would give a figure that says nothing).
"""

from __future__ import annotations

import numpy as np

METRICS = ("spearman", "kendall_tau_weighted", "ndcg", "rbo")
LABELS = {
    "spearman": "Spearman's rho (average ranks for ties)",
    "kendall_tau_weighted": "weighted Kendall tau, additive hyperbolic weights, the mean of "
    "the (x, y) and (y, x) orders (scipy.stats.weightedtau's default)",
    "ndcg": "NDCG of the benchmark's order, gain = downstream rank from the bottom, "
    "discount 1/log2(position + 1), tied positions sharing their mean discount",
    "rbo": "rank-biased overlap, extrapolated (RBO_ext), expected over random tie breaks",
}
DEFAULT_RBO_P = 0.9


def average_ranks(a: np.ndarray) -> np.ndarray:
    """Ranks along the last axis, from 1, ties given the mean of the ranks they span:
    a value's rank is the number of values below it plus (the number equal to it, itself
    included, + 1) / 2."""
    a = np.asarray(a, dtype=float)
    below = (a[..., None, :] < a[..., :, None]).sum(axis=-1)
    equal = (a[..., None, :] == a[..., :, None]).sum(axis=-1)
    return below + (equal + 1) / 2.0


def _pearson_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson's r of each row of x with the same row of y; NaN where a row is constant."""
    xc = x - x.mean(axis=-1, keepdims=True)
    yc = y - y.mean(axis=-1, keepdims=True)
    sxx = (xc * xc).sum(axis=-1)
    syy = (yc * yc).sum(axis=-1)
    sxy = (xc * yc).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = sxy / np.sqrt(sxx * syy)
    r = np.where((sxx > 0) & (syy > 0), r, np.nan)
    return np.clip(r, -1.0, 1.0)


def spearman_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's rho of each row of x with the same row of y (average ranks for ties);
    NaN where either row is constant."""
    return _pearson_rows(average_ranks(x), average_ranks(y))


def _above_and_block(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per element: how many are strictly greater in its row, and how many are equal to it
    (itself included)."""
    above = (a[..., None, :] > a[..., :, None]).sum(axis=-1)
    block = (a[..., None, :] == a[..., :, None]).sum(axis=-1)
    return above, block


def _lex_positions(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each element's position (from 0) when a row is sorted by (x, y) decreasing; equal
    (x, y) pairs take consecutive positions in index order (the index does not matter to
    the weighted tau: they are interchangeable)."""
    xi, xj = x[..., :, None], x[..., None, :]
    yi, yj = y[..., :, None], y[..., None, :]
    before = (xj > xi) | ((xj == xi) & (yj > yi))
    n = x.shape[-1]
    earlier = np.tril(np.ones((n, n), dtype=bool), k=-1)  # j < i
    same = (xj == xi) & (yj == yi) & earlier
    return (before | same).sum(axis=-1)


def _weighted_tau_one_order(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    r = _lex_positions(x, y)
    w = 1.0 / (r + 1.0)
    weights = w[..., :, None] + w[..., None, :]
    sx = np.sign(x[..., :, None] - x[..., None, :])
    sy = np.sign(y[..., :, None] - y[..., None, :])
    num = (weights * sx * sy).sum(axis=(-2, -1))
    nx = (weights * (sx != 0)).sum(axis=(-2, -1))
    ny = (weights * (sy != 0)).sum(axis=(-2, -1))
    with np.errstate(invalid="ignore", divide="ignore"):
        tau = num / np.sqrt(nx * ny)
    tau = np.where((nx > 0) & (ny > 0), tau, np.nan)
    return np.clip(tau, -1.0, 1.0)


def weighted_tau_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The weighted Kendall tau of each row (the module's docstring); NaN where undefined."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    return (_weighted_tau_one_order(x, y) + _weighted_tau_one_order(y, x)) / 2.0


def ndcg_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """NDCG of ordering each row's models by x against their downstream gains from y."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    n = x.shape[-1]
    below_y = (y[..., None, :] < y[..., :, None]).sum(axis=-1)
    equal_y = (y[..., None, :] == y[..., :, None]).sum(axis=-1)
    gain = below_y + (equal_y - 1) / 2.0  # the average rank from 1, minus 1
    disc = 1.0 / np.log2(np.arange(1, n + 1) + 1.0)
    cum = np.concatenate([[0.0], np.cumsum(disc)])
    above, block = _above_and_block(x)
    mean_disc = (cum[above + block] - cum[above]) / block
    dcg = (gain * mean_disc).sum(axis=-1)
    ideal = (-np.sort(-gain, axis=-1) * disc).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = dcg / ideal
    return np.where(_constant(x) | _constant(y) | ~(ideal > 0), np.nan, out)


def _constant(a: np.ndarray) -> np.ndarray:
    """Whether each row holds one value only (no ranking to compare)."""
    return (a == a[..., :1]).all(axis=-1)


def _membership(a: np.ndarray) -> np.ndarray:
    """P(element in the top d) for d = 1..n under random tie breaks: shape (..., n_d, n)."""
    n = a.shape[-1]
    above, block = _above_and_block(a)
    depth = np.arange(1, n + 1, dtype=float)[:, None]  # (n_d, 1)
    left = depth - above[..., None, :]
    return np.clip(left / block[..., None, :], 0.0, 1.0)


def rbo_rows(x: np.ndarray, y: np.ndarray, p: float = DEFAULT_RBO_P) -> np.ndarray:
    """The expected extrapolated RBO of the rankings by x and by y (both decreasing)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    n = x.shape[-1]
    overlap = (_membership(x) * _membership(y)).sum(axis=-1)  # (..., n_d): E[X_d]
    depth = np.arange(1, n + 1, dtype=float)
    agree = overlap / depth
    weights = (1.0 - p) * p ** (depth - 1.0)
    out = agree[..., -1] * p**n + (agree * weights).sum(axis=-1)
    return np.where(_constant(x) | _constant(y), np.nan, out)


def metric_rows(name: str, x: np.ndarray, y: np.ndarray, rbo_p: float) -> np.ndarray:
    """One metric of each row (``METRICS``)."""
    if name == "spearman":
        return spearman_rows(np.asarray(x, dtype=float), np.asarray(y, dtype=float))
    if name == "kendall_tau_weighted":
        return weighted_tau_rows(x, y)
    if name == "ndcg":
        return ndcg_rows(x, y)
    if name == "rbo":
        return rbo_rows(x, y, rbo_p)
    raise KeyError(name)


def value(name: str, x: list[float], y: list[float], rbo_p: float = DEFAULT_RBO_P) -> float | None:
    """One metric of one pair of sequences; None where undefined."""
    v = float(metric_rows(name, np.asarray([x], dtype=float), np.asarray([y], dtype=float),
                          rbo_p)[0])  # fmt: skip
    return None if np.isnan(v) else v
