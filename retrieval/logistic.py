"""A small ridge-regularised logistic regression (Newton's method), enough for a handful of features."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from retrieval.relevance import Logistic


def fit_logistic(
    rows: Sequence[Mapping[str, float]],
    labels: Sequence[bool],
    names: Sequence[str],
    *,
    ridge: float = 1.0,
    threshold: float = 0.5,
    sample_weights: Sequence[float] | None = None,
) -> Logistic:
    """Fit P(label | features) on standardised features; weights come back on the raw scale.

    ``sample_weights`` (default 1 each) let many rows of one source count as fewer: a large
    background of generic questions must not outweigh the labelled ones.
    """
    x = np.array([[row.get(n, 0.0) for n in names] for row in rows], dtype=float)
    y = np.array(labels, dtype=float)
    s = np.ones(len(y)) if sample_weights is None else np.array(sample_weights, dtype=float)
    if len(set(labels)) < 2:
        raise ValueError("a logistic model needs examples of both outcomes")
    mean, std = x.mean(axis=0), x.std(axis=0)
    std[std == 0] = 1.0
    z = np.hstack([np.ones((len(x), 1)), (x - mean) / std])
    beta = np.zeros(z.shape[1])
    penalty = np.eye(z.shape[1]) * ridge
    penalty[0, 0] = 0.0  # the intercept is not shrunk
    for _ in range(50):
        p = 1 / (1 + np.exp(-np.clip(z @ beta, -30, 30)))
        gradient = z.T @ (s * (y - p)) - penalty @ beta
        hessian = z.T @ (z * (s * p * (1 - p))[:, None]) + penalty
        step = np.linalg.solve(hessian, gradient)
        beta += step
        if np.abs(step).max() < 1e-8:
            break
    weights = beta[1:] / std
    bias = beta[0] - float(np.sum(weights * mean))
    return Logistic(
        weights={n: round(float(w), 4) for n, w in zip(names, weights, strict=True)},
        bias=round(float(bias), 4),
        threshold=threshold,
    )
