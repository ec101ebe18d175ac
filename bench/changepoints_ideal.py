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

Columns: each model's F1; "leader" = the model with the larger final log-evidence given its confirmed change
points (as bench/changepoints.py); "BMA" = a model's confirmation kept only when the stream-level change
probability, Σ_m p(m | y) p(change | y, m) with p(m | y) from each model's evidence marginalised over its
current segment's change hypotheses, exceeds the threshold at that block.

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
        pts = {m: merge([a[0] for al, _ in r for a in al], 5) for m, r in runs.items()}
        log_z = {m: sum(rows[-1]["log_z"] for _, rows in r) for m, r in runs.items()}
        leader = max(log_z, key=log_z.get)
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
        table.append((name, leader, log_z, f1, pts))
    print("| series | exact log Z ar1 / gmm1 (given its change points) | leader | ar1 | gmm1 | leader | BMA |")
    print("|---|---|---|---|---|---|---|")
    for name, leader, log_z, f1, _ in table:
        print(f"| {name} | {log_z['ar1']:.1f} / {log_z['gmm1']:.1f} | {leader} | "
              + " | ".join(f"{f1[k]:.3f}" for k in ("ar1", "gmm1", "leader", "bma")) + " |")  # fmt: skip
    mean = {k: np.mean([t[3][k] for t in table]) for k in ("ar1", "gmm1", "leader", "bma")}
    print("| **mean** | | | " + " | ".join(f"**{v:.3f}**" for v in mean.values()) + " |")
    for name, _, _, _, pts in table:
        print(f"{name}: ar1 {pts['ar1']}; gmm1 {pts['gmm1']}")
    print(f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
