"""The change-point rule of :mod:`workers.segmented` with exact evidences and a candidate at every observation.

What the challengers approximate, computed exactly for the two models of bench/changepoints.py, on the same
eight standardised series, in the same blocks of 5: AR(1) with unknown noise per column (``autoregressive``,
order 1, the family's default prior) and the joint i.i.d. Gaussian (``gmm`` with one component, closed form,
:func:`models.conjugate.gmm_one_component_log_evidence`).  After each block, every observation ``t`` of the
current segment ``s..n`` is a candidate, ``log B_t = log Z(y_{s..t−1}) + log Z(y_{t..n}) − log Z(y_{s..n})``
(:mod:`workers.changepoint`), ``p_t = ρ B_t / (1 + Σ_u ρ B_u)``; when the candidates that scored at least
``min_age`` observations hold more than ``threshold``, the most probable of them is confirmed and starts the
new segment.  Hazard, threshold and ``min_age`` are :class:`ChangepointSettings`' defaults.

So the F1 of this script is what the challengers would score with no Monte Carlo error and no missed
candidate location: it separates the model's answer from the engine's approximation.

A third model, not in the service (session 32): AR(1) whose intercept alone changes at change points, the
coefficient and σ² shared by all segments (:class:`ExactAR1Level`, :func:`detect_level`), the level shift that
AR(1) with φ near 1 absorbs as one large innovation.

Columns: each model's F1; "leader" = of ar1 and gmm1, the model with the larger final log-evidence given its
confirmed change points (as bench/changepoints.py); "leader3" the same of the three; "BMA" = a model's
confirmation kept only when the stream-level change probability, Σ_m p(m | y) p(change | y, m) with p(m | y)
from each model's evidence marginalised over its current segment's change hypotheses, exceeds the threshold at
that block (over all three models).

The AR(1) evidence with unknown noise is not closed form (independent normal priors on the coefficient and
the intercept, inverse-gamma on σ²): it is the known-noise closed form integrated over log σ² on a grid
(3,000 points, 1e-7..1e3; checked against scipy quadrature to 1e-6 nats).

    python bench/changepoints_ideal.py
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np
from scipy.special import gammaln, logsumexp

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from changepoints import ALL_SERIES, merge, series  # noqa: E402
from tcpd_metrics import f1_score  # noqa: E402

from models.autoregressive import AutoregressiveParams  # noqa: E402
from models.gmm import GaussianMixtureParams  # noqa: E402
from workers.changepoint import ChangepointSettings, log_prior_odds  # noqa: E402

LOG_2PI = math.log(2 * math.pi)
BLOCK = 5


class ExactAR1:
    """Exact ``log p(y_{a..b−1} | y_{a−1})`` of AR(1) with unknown noise for any rows ``a..b−1`` (vectorised)."""

    def __init__(self, y: np.ndarray):
        p = AutoregressiveParams(order=1)
        self.s2, self.m0 = p.prior_std**2, np.array([p.coefficient_location, p.intercept_location])
        lv = np.linspace(math.log(1e-7), math.log(1e3), 3000)
        v = np.exp(lv)  # σ² grid; log IG(v; a, b) + log v (the grid is in log v) + log Δ
        a, b = p.variance_shape, p.variance_scale
        self.v = v[:, None]
        self.log_w = (a * math.log(b) - gammaln(a) - (a + 1) * lv - b / v + lv + math.log(lv[1] - lv[0]))[:, None]
        self.first = 1  # row t predicts y_t from y_{t−1}; y_0 is conditioned on
        x = np.r_[0.0, y[:-1]]
        r = y - self.m0[0] * x - self.m0[1]  # residual of the prior mean: zero prior mean after the shift
        rows = np.stack([np.ones_like(y), x * x, x, x * r, r, r * r])
        rows[:, 0] = 0.0
        self.cum = np.concatenate([np.zeros((6, 1)), np.cumsum(rows, 1)], 1)  # cum[:, i] = Σ rows < i

    def log_z(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        n, sxx, sx, sxr, sr, srr = self.cum[:, b] - self.cum[:, a]
        v, s2 = self.v, self.s2
        p11, p12, p22 = sxx / v + 1 / s2, sx / v, n / v + 1 / s2  # posterior precision of (coef, intercept)
        b1, b2 = sxr / v, sr / v
        det = p11 * p22 - p12**2
        quad = srr / v - (p22 * b1**2 - 2 * p12 * b1 * b2 + p11 * b2**2) / det
        ll = -0.5 * n * LOG_2PI - 0.5 * n * np.log(v) - math.log(s2) - 0.5 * np.log(det) - 0.5 * quad
        return np.where(n > 0, logsumexp(ll + self.log_w, axis=0), 0.0)


class ExactGaussian:
    """Exact log-evidence of ``gmm`` with one component (per-dimension normal–inverse-gamma) of rows ``a..b−1``."""

    def __init__(self, y: np.ndarray):
        p = GaussianMixtureParams(dim=y.shape[1], components=1)
        self.a0, self.b0, self.k0 = p.variance_shape, p.variance_scale, 1.0 / p.mean_variance_ratio
        y = y - p.mean_location
        self.first = 0
        zero = np.zeros((1, y.shape[1]))
        self.c1, self.c2 = np.concatenate([zero, np.cumsum(y, 0)]), np.concatenate([zero, np.cumsum(y * y, 0)])

    def log_z(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        n = (b - a)[:, None].astype(float)
        s1, s2 = self.c1[b] - self.c1[a], self.c2[b] - self.c2[a]
        kn, an = self.k0 + n, self.a0 + 0.5 * n
        mean = s1 / np.maximum(n, 1)
        bn = self.b0 + 0.5 * (s2 - n * mean**2) + self.k0 * n * mean**2 / (2 * kn)
        per = gammaln(an) - gammaln(self.a0) + self.a0 * math.log(self.b0) - an * np.log(bn)
        return (per + 0.5 * np.log(self.k0 / kn) - 0.5 * n * LOG_2PI).sum(1)


class ExactAR1Level:
    """Exact evidence of AR(1) with unknown noise whose intercept alone changes at change points: one coefficient a
    and one σ² for the whole stream, an intercept c_j per segment (each c_j ~ N(intercept_location, prior_std²), a
    and σ² with the family's priors).  Given σ², every c_j and then a integrate out in closed form (each segment's
    residuals ``y_t − a·y_{t−1}`` are Gaussian with covariance ``σ²I + s²11ᵀ``, a quadratic in a); σ² on the
    grid of :class:`ExactAR1`.  With one segment it is :class:`ExactAR1`'s evidence (checked in ``main``)."""

    def __init__(self, y: np.ndarray):
        p = AutoregressiveParams(order=1)
        self.s2, self.ma, self.mc = p.prior_std**2, p.coefficient_location, p.intercept_location
        base = ExactAR1(y)
        self.v, self.log_w = base.v[:, 0], base.log_w[:, 0]  # [G]
        self.first = 1
        self.shape = (4, self.v.shape[0])
        x = np.r_[0.0, y[:-1]]
        u = y - self.mc
        rows = np.stack([np.ones_like(y), x, u, x * x, x * u, u * u])
        rows[:, 0] = 0.0
        self.cum = np.concatenate([np.zeros((6, 1)), np.cumsum(rows, 1)], 1)

    def terms(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Per segment ``a..b−1`` and σ² (``[4, len(a), G]``): log-density terms free of the coefficient, and the
        coefficients of ``−½(α − 2β·a + γ·a²)`` after the segment's intercept is integrated out."""
        m, sx, su, xx, xu, uu = (self.cum[:, b] - self.cum[:, a])[:, :, None]
        v, s2 = self.v[None, :], self.s2
        w = s2 / (v + m * s2)
        const = -0.5 * m * LOG_2PI - 0.5 * m * np.log(v) - 0.5 * np.log1p(m * s2 / v)
        alpha, beta, gamma = (uu - w * su * su) / v, (xu - w * su * sx) / v, (xx - w * sx * sx) / v
        return np.stack([np.where(m > 0, const, 0.0), alpha, beta, gamma])

    def log_z(self, t: np.ndarray) -> np.ndarray:
        """log-evidence from summed segment terms ``t: [4, ..., G]`` (the coefficient then σ² integrated out)."""
        const, alpha, beta, gamma = t
        g = gamma + 1 / self.s2
        b = beta + self.ma / self.s2
        a = alpha + self.ma**2 / self.s2
        la = const - 0.5 * math.log(self.s2) - 0.5 * np.log(g) - 0.5 * (a - b * b / g)
        return logsumexp(la + self.log_w, axis=-1)


class ExactAR1Shift:
    """Exact evidence of AR(1) whose intercept and noise variance both change at change points, the coefficient a
    shared by all segments: given a, each segment's residuals ``y_t − a·y_{t−1}`` are a one-component ``gmm``
    (normal–inverse-gamma, the ``gmm`` family's default prior, closed form); a ~ N(coefficient_location,
    prior_std²) on a grid of 4,001 points over ±2.  Not the ``autoregressive`` family's prior (there the
    intercept's prior does not scale with σ²): an exploration of the model set, not a reference value."""

    def __init__(self, y: np.ndarray):
        p, g = AutoregressiveParams(order=1), GaussianMixtureParams(dim=1, components=1)
        self.a0, self.b0, self.k0, self.mu0 = g.variance_shape, g.variance_scale, 1.0 / g.mean_variance_ratio, 0.0
        self.grid = np.linspace(-2.0, 2.0, 4001)
        d = self.grid[1] - self.grid[0]
        s2 = p.prior_std**2
        a = self.grid - p.coefficient_location
        self.log_w = -0.5 * a * a / s2 - 0.5 * math.log(2 * math.pi * s2) + math.log(d)
        self.first = 1
        x = np.r_[0.0, y[:-1]]
        rows = np.stack([np.ones_like(y), x, y, x * x, x * y, y * y])
        rows[:, 0] = 0.0
        self.cum = np.concatenate([np.zeros((6, 1)), np.cumsum(rows, 1)], 1)
        self.shape = (self.grid.shape[0],)

    def terms(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``[len(a), A]``: each segment's log-evidence at every coefficient of the grid."""
        m, sx, sy, xx, xy, yy = (self.cum[:, b] - self.cum[:, a])[:, :, None]
        c = self.grid[None, :]
        s1 = sy - c * sx - m * self.mu0
        s2 = yy - 2 * c * xy + c * c * xx  # Σ r² (prior mean 0)
        kn, an = self.k0 + m, self.a0 + 0.5 * m
        mean = s1 / np.maximum(m, 1)
        bn = self.b0 + 0.5 * np.maximum(s2 - m * mean**2, 0.0) + self.k0 * m * mean**2 / (2 * kn)
        per = gammaln(an) - gammaln(self.a0) + self.a0 * math.log(self.b0) - an * np.log(bn)
        return np.where(m > 0, per + 0.5 * np.log(self.k0 / kn) - 0.5 * m * LOG_2PI, 0.0)

    def log_z(self, t: np.ndarray) -> np.ndarray:
        return logsumexp(t + self.log_w, axis=-1)


def detect_level(model: ExactAR1Level | ExactAR1Shift, n_total: int, cps: ChangepointSettings):
    """:func:`detect`'s rule for :class:`ExactAR1Level` and :class:`ExactAR1Shift`, whose segments share the
    coefficient (and σ² for the first): a candidate's
    ``log B_t`` compares the whole stream's evidence with the current segment split at ``t`` against unsplit."""
    lo = log_prior_odds(cps.hazard)
    s, alerts, rows = model.first, [], []
    closed = np.zeros(model.shape)  # the closed segments' summed terms
    for end in range(BLOCK, n_total + BLOCK, BLOCK):
        n = min(end, n_total)
        ts = np.arange(s + 1, n)
        whole = closed + np.take(model.terms(np.array([s]), np.array([n])), 0, axis=-2)
        z0 = float(model.log_z(whole))
        if len(ts) == 0:
            rows.append({"log_z": z0, "marginal": z0, "p": 0.0})
            continue
        split = np.expand_dims(closed, -2) + model.terms(np.full(len(ts), s), ts) + model.terms(ts, np.full(len(ts), n))
        lb = model.log_z(split) - z0
        terms = np.r_[0.0, lb + lo]
        norm = float(logsumexp(terms))
        p = np.exp(terms[1:] - norm)
        row = {"log_z": z0, "marginal": z0 + norm, "p": float(p.sum())}
        eligible = np.flatnonzero(n - ts >= cps.min_age)
        if eligible.size and p[eligible].sum() > cps.threshold:
            i = eligible[np.argmax(p[eligible])]
            alerts.append((int(ts[i]), n - 1, float(lb[i])))
            row["alert"] = int(ts[i])
            closed = closed + np.take(model.terms(np.array([s]), np.array([int(ts[i])])), 0, axis=-2)
            s = int(ts[i])
            row["log_z"] = float(model.log_z(closed + np.take(model.terms(np.array([s]), np.array([n])), 0, axis=-2)))
        rows.append(row)
    return alerts, rows


def detect(model, n_total: int, cps: ChangepointSettings) -> tuple[list[tuple[int, int, float]], list[dict]]:
    """The rule of the module docstring: (alerts (location, detected at, log B), per-block rows)."""
    lo = log_prior_odds(cps.hazard)
    s, offset, alerts, rows = model.first, 0.0, [], []
    for end in range(BLOCK, n_total + BLOCK, BLOCK):
        n = min(end, n_total)
        ts = np.arange(s + 1, n)  # a change at t: rows s..t−1 and t..n−1
        z0 = float(model.log_z(np.array([s]), np.array([n]))[0])
        if len(ts) == 0:
            rows.append({"log_z": offset + z0, "marginal": offset + z0, "p": 0.0})
            continue
        pre = model.log_z(np.full(len(ts), s), ts)
        lb = pre + model.log_z(ts, np.full(len(ts), n)) - z0
        terms = np.r_[0.0, lb + lo]
        norm = float(logsumexp(terms))
        p = np.exp(terms[1:] - norm)
        row = {"log_z": offset + z0, "marginal": offset + z0 + norm, "p": float(p.sum())}
        eligible = np.flatnonzero(n - ts >= cps.min_age)
        if eligible.size and p[eligible].sum() > cps.threshold:
            i = eligible[np.argmax(p[eligible])]
            alerts.append((int(ts[i]), n - 1, float(lb[i])))
            row["alert"] = int(ts[i])
            offset += float(pre[i])
            s = int(ts[i])
            row["log_z"] = offset + float(model.log_z(np.array([s]), np.array([n]))[0])
        rows.append(row)
    return alerts, rows


def main() -> None:
    cps = ChangepointSettings()
    print(f"exact evidences, a candidate at every observation; blocks of {BLOCK}; {cps.hazard=}, "
          f"{cps.threshold=}, {cps.min_age=}")  # fmt: skip
    t0 = time.perf_counter()
    table = []
    for name in ALL_SERIES:
        s = series(name)
        z = s.standardised()
        runs = {"ar1": [detect(ExactAR1(z[:, j]), s.n, cps) for j in range(z.shape[1])]}
        runs["gmm1"] = [detect(ExactGaussian(z), s.n, cps)]
        runs["ar1level"] = [detect_level(ExactAR1Level(z[:, j]), s.n, cps) for j in range(z.shape[1])]
        runs["ar1shift"] = [detect_level(ExactAR1Shift(z[:, j]), s.n, cps) for j in range(z.shape[1])]
        pts = {m: merge([a[0] for al, _ in r for a in al], 5) for m, r in runs.items()}
        log_z = {m: sum(rows[-1]["log_z"] for _, rows in r) for m, r in runs.items()}
        leader = max(("ar1", "gmm1"), key=log_z.get)
        leader3 = max(("ar1", "gmm1", "ar1level"), key=log_z.get)
        leader4 = max(log_z, key=log_z.get)
        # BMA gate: per block, p(m | y) from the marginal evidences, p(change | y, m) = 1 − Π_parts (1 − p)
        ms = list(runs)
        marg = np.array(
            [[sum(rows[b]["marginal"] for _, rows in runs[m]) for b in range(len(runs[m][0][1]))] for m in ms]
        )
        post = np.exp(marg - logsumexp(marg, axis=0))
        q = np.array(
            [[1 - np.prod([1 - rows[b]["p"] for _, rows in runs[m]]) for b in range(marg.shape[1])] for m in ms]
        )
        stream = (post * q).sum(0)
        bma = [row["alert"] for m in ms for _, rows in runs[m] for b, row in enumerate(rows) if "alert" in row
               and stream[b] > cps.threshold]  # fmt: skip
        f1 = {m: f1_score(s.annotations, p) for m, p in pts.items()}
        f1["leader"], f1["bma"] = f1[leader], f1_score(s.annotations, merge(bma, 5))
        f1["leader3"], f1["leader4"] = f1[leader3], f1[leader4]
        table.append((name, f"{leader} / {leader3} / {leader4}", log_z, f1, pts))
    cols = ("ar1", "gmm1", "ar1level", "ar1shift", "leader", "leader3", "leader4", "bma")
    print("| series | exact log Z ar1 / gmm1 / ar1level / ar1shift (given its change points) | leader of 2 / 3 / 4 | "
          + " | ".join(cols) + " |")  # fmt: skip
    print("|---" * (3 + len(cols)) + "|")
    for name, leader, log_z, f1, _ in table:
        print(f"| {name} | " + " / ".join(f"{v:.1f}" for v in log_z.values()) + f" | {leader} | "
              + " | ".join(f"{f1[k]:.3f}" for k in cols) + " |")  # fmt: skip
    mean = {k: np.mean([t[3][k] for t in table]) for k in cols}
    print("| **mean** | | | " + " | ".join(f"**{v:.3f}**" for v in mean.values()) + " |")
    for name, _, _, _, pts in table:
        print(f"{name}: " + "; ".join(f"{m} {p}" for m, p in pts.items()))
    print(f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
