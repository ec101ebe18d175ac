"""Change-point metrics of TCPDBench (van den Burg & Williams 2020, "An evaluation of change point
detection algorithms", arXiv:2003.06222, §4): F1 with a margin and segmentation covering.

Conventions as in the paper's evaluation: locations are 0-based; index 0 is added to every
annotator's set and to the predictions (the start of the series counts as a change point);
precision is computed against the union of all annotators' points, recall per annotator and
averaged; a true positive matches at most one prediction (no double counting).

>>> f1_score({"a": [10, 20], "b": [11, 20], "c": [10], "d": [0, 5]}, [10, 20])
1.0
>>> round(f1_score({"a": [], "b": [10], "c": [50]}, [10]), 6)
0.909091
>>> round(f1_score({"a": [], "b": [10], "c": [50]}, []), 6)
0.8
>>> round(covering({"a": [10, 20], "b": [10], "c": [0, 5]}, [10, 20], 45), 6)
0.796296
>>> round(covering({"a": [], "b": [10], "c": [40]}, [], 45), 6)
0.81893
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def matched(truth: Iterable[int], predicted: Iterable[int], margin: int = 5) -> set[int]:
    """Points of ``truth`` with a prediction within ``margin``, each prediction used at most once
    (the closest free prediction is taken, truth points in ascending order)."""
    free = set(predicted)
    hits = set()
    for tau in sorted(set(truth)):
        near = sorted((abs(tau - x), x) for x in free if abs(tau - x) <= margin)
        if near:
            hits.add(tau)
            free.remove(near[0][1])
    return hits


def precision_recall(
    annotations: Mapping[str, Iterable[int]], predicted: Iterable[int], margin: int = 5
) -> tuple[float, float]:
    """(precision against the union of annotators, recall averaged over annotators)."""
    per = [set(a) | {0} for a in annotations.values()]
    union = set().union(*per)
    X = set(predicted) | {0}
    precision = len(matched(union, X, margin)) / len(X)
    recall = sum(len(matched(T, X, margin)) / len(T) for T in per) / len(per)
    return precision, recall


def f1_score(annotations: Mapping[str, Iterable[int]], predicted: Iterable[int], margin: int = 5) -> float:
    """Harmonic mean of :func:`precision_recall` (0 when both are 0)."""
    p, r = precision_recall(annotations, predicted, margin)
    return 0.0 if p + r == 0 else 2 * p * r / (p + r)


def segments(locations: Iterable[int], n: int) -> list[range]:
    """The partition of ``0..n-1`` that starts a new segment at each location."""
    cuts = sorted({c for c in locations if 0 < c < n})
    bounds = [0, *cuts, n]
    return [range(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _jaccard(a: range, b: range) -> float:
    inter = max(0, min(a.stop, b.stop) - max(a.start, b.start))
    return inter / (len(a) + len(b) - inter)


def cover(predicted_segments: list[range], true_segments: list[range]) -> float:
    """Covering of a true segmentation by a predicted one (Arbeláez et al. 2011, eq. 8)."""
    n = sum(map(len, true_segments))
    return sum(len(R) * max(_jaccard(R, P) for P in predicted_segments) for R in true_segments) / n


def covering(annotations: Mapping[str, Iterable[int]], predicted: Iterable[int], n: int) -> float:
    """Segmentation covering of the predictions, averaged over annotators."""
    pred = segments(predicted, n)
    covers = [cover(pred, segments(a, n)) for a in annotations.values()]
    return sum(covers) / len(covers)
