"""Prior–data conflict, unbiased re-annealing, the dimension-scaled change trigger and the reservoir (issue 10 §3/§4).

Every number is against an exact log-evidence (:mod:`models.conjugate`: Murphy 2007 eq. 95 for the one-component
``gmm``, Bishop 2006 eq. 3.86 for ``linear_regression`` with known noise), per seed, with the model's status
(``degraded`` reason or ok).  Sections (all by default, or name some):

``raw``
    Data on their own scale with default priors (acceptance 3): a one-component ``gmm`` on ``N(300, 20²)`` at
    n = 500/1000/1500/2000; the raw Nile flows (``tests/data/nile.csv``, 100 values near 900); a regression
    ``y = 5·x0 + N(0, 1)``, ``x0 ~ U(0, 20)``, in blocks of 10 (``workers/conflict.py``, ``workers/sgais.py``).
``trigger``
    Annealing steps per block after the warm-up on stationary linear regressions with D = 4 and D = 61
    parameters, against the change threshold ``reanneal_steps·max(1, √(D/4))`` (``stacking.change_threshold``).
``merges``
    Acceptance 4: no SGHMC moves (``burn_in`` 0, ``change_burn_in`` 0) and no resampling, so every estimate
    is plain importance sampling from the prior and ``E[Ẑ/Z] = 1`` exactly whatever the annealing schedule.
    A regression whose slope changes at 2n/3 triggers a re-annealing on the block after the change when that
    block needs ``reanneal_steps`` annealing steps: an event that depends on the running population.  Per seed:
    ``Ẑ/Z`` of the replay that replaces the running estimate (the code), and of the OLD merge
    ``(Ẑ_running + Ẑ_replay)/2`` on the same event (computed from the same run: ``log Ẑ_running`` is the row's
    ``log_evidence − log_evidence_correction``).
    Then WITH moves (default sampler): a one-component ``gmm`` on ``N(0, 1)`` whose mean jumps to 3 at n = 2500
    (after the warm-up): at each re-annealing, ``log Ẑ_running``, ``log Ẑ_replay`` (the code) and the old
    ``log((Ẑ_running + Ẑ_replay)/2)`` against the exact evidence — the old merge's loss of up to ``log 2``
    per merge when the running population lags the moving posterior.
``drift``
    Issue 10, the running estimate between re-annealings (``workers/stacking.py``, "Moving posteriors"): the
    ``merges`` gmm (mean 3 from n = 2500) to n = 6000, per block from n = 3000: ``log Ẑ − log Z``, the reported
    SE, the block's annealing steps (R: re-annealed) and the status.
``stationary``
    The same rule's false flags: stationary well-specified gmm, linear regression (known and unknown noise,
    d = 3) and AR(1) to ``--stationary-n``: status and the most annealing steps of a block after the warm-up.
``stepsize``
    Issue 10, the SGHMC step-size bias of the first block: a normal–inverse-gamma regression (d = 3, the model
    and coefficients of ``tests/models/test_evidence.py``, numpy seed 100), first-block variants at n = 500;
    then lr 0.03 and burn-in 60 for the first block only, to n = 2,000 (not run by default).
``reservoir``
    ``history_capacity`` 500 against the whole history: a one-component ``gmm`` on ``N(0, 1)`` and a linear
    regression with 5 standard-normal features, n = 20,000 (``--reservoir-n``).

    python bench/conflict.py [raw] [trigger] [merges] [drift] [stationary] [stepsize] [reservoir] [--seeds 3]
        [--merge-seeds 100] [--reanneal-steps 6] [--stationary-n 10000]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models.conjugate import LinearRegressionEvidence, gmm_one_component_log_evidence  # noqa: E402
from workers.engine import ModelEngine  # noqa: E402
from workers.settings import SamplerSettings  # noqa: E402
from workers.stacking import change_threshold  # noqa: E402

NILE = Path(__file__).resolve().parent.parent / "tests" / "data" / "nile.csv"
GMM1 = ("gmm", {"dim": 1, "components": 1})


def status(e: ModelEngine) -> str:
    return "ok" if e.degraded is None else f"degraded ({e.degraded[:60]}...)"


def raw(seeds: int) -> None:
    print("## raw scale, default priors: log Ẑ − log Z (nats), status")
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        y = rng.normal(300.0, 20.0, 2000)
        e = ModelEngine(*GMM1, {"seed": seed})
        errs = []
        for stop in (500, 1000, 1500, 2000):
            e.update(None, y[e.observations : stop].tolist())
            errs.append(f"n={stop}: {e.log_evidence - gmm_one_component_log_evidence(y[:stop]):+.2f}")
        print(f"gmm N(300, 20²) seed {seed}: {', '.join(errs)}; {status(e)}", flush=True)
    y = np.loadtxt(NILE, delimiter=",", skiprows=1)[:, 1]
    exact = gmm_one_component_log_evidence(y)
    for seed in range(seeds):
        e = ModelEngine(*GMM1, {"seed": seed})
        e.update(None, y.tolist())
        print(f"raw Nile (n=100) seed {seed}: {e.log_evidence - exact:+.2f} (exact {exact:.2f}); {status(e)}")
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        X = rng.uniform(0.0, 20.0, (500, 1))
        y = 5.0 * X[:, 0] + rng.normal(0.0, 1.0, 500)
        e = ModelEngine("linear_regression", {"features": 1}, {"block_size": 10, "seed": seed})
        try:
            e.update(X.tolist(), y.tolist())
            err = f"{e.log_evidence - LinearRegressionEvidence(1).update(X, y).log_evidence:+.2f}; {status(e)}"
        except Exception as exc:  # noqa: BLE001 - report the failure as a bench line
            err = f"failed: {exc!r:.80}"
        print(f"regression y=5·x0, x0~U(0,20), blocks of 10, n=500, seed {seed}: {err}", flush=True)


def trigger(seeds: int) -> None:
    print("## change trigger on stationary regressions (blocks of 500 after the 2000-observation warm-up)")
    for d in (3, 60):
        for seed in range(seeds):
            rng = np.random.default_rng(seed)
            n = 4500
            X = rng.normal(size=(n, d))
            y = X @ (0.5 * rng.normal(size=d)) + rng.normal(size=n)
            e = ModelEngine("linear_regression", {"features": d}, {"seed": seed, "reanneal_steps": None})
            steps = [i.annealing_steps for i in e.update(X.tolist(), y.tolist())]
            D = d + 1
            print(
                f"D={D} seed {seed}: steps after warm-up {steps[4:]} (warm-up {steps[:4]}); threshold "
                f"unscaled 12, scaled {change_threshold(12, D):.1f}",
                flush=True,
            )


#: The merges section's sampler: no SGHMC moves, no resampling, no warm-up reduction (plain IS from the prior).
NO_MOVES = {
    "particles": 50,
    "warmup_particles": None,
    "warmup_observations": 0,
    "burn_in": 0,
    "change_burn_in": 0,
    "resample_threshold": 0.0,
    "block_size": 10,
}


def merge_data(n: int = 30) -> tuple[np.ndarray, np.ndarray]:
    """``X: [n, 1]``, ``y: [n]``: slope 0.5 then −1.5 from 2n/3, intercept 0.3, unit noise (fixed draw)."""
    rng = np.random.default_rng(12345)
    X = rng.normal(size=(n, 1))
    slope = np.where(np.arange(n) < 2 * n // 3, 0.5, -1.5)
    return X, slope * X[:, 0] + 0.3 + rng.normal(size=n)


def merge_run(seed: int, X: np.ndarray, y: np.ndarray, reanneal_steps: int) -> tuple[float, float, int]:
    """``(log Ẑ, log Ẑ_old, re-annealings)`` of one seed; ``log Ẑ_old`` is the old merge's
    ``log((Ẑ_running + Ẑ_replay)/2)`` when the last block re-annealed, else ``log Ẑ``."""
    e = ModelEngine("linear_regression", {"features": 1}, {**NO_MOVES, "seed": seed, "reanneal_steps": reanneal_steps})
    infos = e.update(X.tolist(), y.tolist())
    new, last = e.log_evidence, infos[-1]
    old = new
    if last.reannealed:
        old = float(np.logaddexp(new - last.log_evidence_correction, new) - math.log(2.0))
    return new, old, sum(i.reannealed for i in infos)


def ratio_summary(log_ratio: np.ndarray) -> str:
    """Mean of ``Ẑ/Z``, its standard error, the sample's ESS ``(Σr)²/Σr²`` and the mean of ``log Ẑ − log Z``."""
    r = np.exp(log_ratio)
    se = r.std(ddof=1) / math.sqrt(len(r))
    return (
        f"mean Ẑ/Z {r.mean():.3f} ± {se:.3f} (SE; {(r.mean() - 1) / se:+.1f} SE from 1), ESS of the ratios "
        f"{r.sum() ** 2 / (r**2).sum():.0f} of {len(r)}, mean log Ẑ − log Z {log_ratio.mean():+.3f}"
    )


def merges(seeds: int, reanneal_steps: int = 6) -> None:
    X, y = merge_data()
    Z = LinearRegressionEvidence(1).update(X, y).log_evidence
    t0 = time.perf_counter()
    runs = np.array([merge_run(s, X, y, reanneal_steps) for s in range(seeds)])
    new, old, count = runs[:, 0] - Z, runs[:, 1] - Z, runs[:, 2]
    on = new != old
    print(f"## merges: no SGHMC moves, n=30, blocks of 10, reanneal_steps {reanneal_steps}, {seeds} seeds")
    seconds = time.perf_counter() - t0
    print(f"re-annealings per run {count.mean():.2f}; last block re-annealed in {on.sum()} runs ({seconds:.0f} s)")
    print(f"replace (code): {ratio_summary(new)}")
    print(f"old merge (avg): {ratio_summary(old)}")
    if on.any():
        gap = new[on] - old[on]
        print(
            f"on the re-annealed runs: log Ẑ_replay − log Ẑ_old {gap.mean():+.3f} nats (mean), running estimate "
            f"below the replay in {(runs[on, 1] < runs[on, 0]).mean():.0%} of them"
        )


def merges_with_moves(seeds: int) -> None:
    print("## merges with SGHMC moves: gmm on N(0, 1), mean 3 from n = 2500, blocks of 500, default sampler")
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        y = np.concatenate([rng.normal(0.0, 1.0, 2500), rng.normal(3.0, 1.0, 2500)])
        e = ModelEngine(*GMM1, {"seed": seed})
        t0 = time.perf_counter()
        for stop in range(500, y.size + 1, 500):
            (info,) = e.update(None, y[e.observations : stop].tolist())
            if info.reannealed:
                exact = gmm_one_component_log_evidence(y[:stop])
                new = e.log_evidence
                running = new - info.log_evidence_correction
                old = float(np.logaddexp(running, new) - math.log(2.0))
                print(
                    f"seed {seed} n={stop}: running {running - exact:+.2f}, replay (code) {new - exact:+.2f}, "
                    f"old average {old - exact:+.2f} nats vs exact; {status(e)}",
                    flush=True,
                )
        print(
            f"seed {seed}: final log Ẑ − log Z {e.log_evidence - gmm_one_component_log_evidence(y):+.2f} "
            f"({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )


def drift(seeds: int) -> None:
    print("## drift between re-annealings: gmm on N(0, 1), mean 3 from n = 2500, 500-value chunks, default sampler")
    print("seed: per 500 values from n = 3,000, log Ẑ − log Z / reported SE / annealing steps / status (D = degraded)")
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        y = np.concatenate([rng.normal(0.0, 1.0, 2500), rng.normal(3.0, 1.0, 3500)])
        e = ModelEngine(*GMM1, {"seed": seed})
        cells = []
        for stop in range(500, y.size + 1, 500):
            (info,) = e.update(None, y[e.observations : stop].tolist())
            if stop >= 3000:
                err = e.log_evidence - gmm_one_component_log_evidence(y[:stop])
                tag = "R" if info.reannealed else ""
                cells.append(
                    f"{err:+.2f}/{e.log_evidence_se:.2f}/{info.annealing_steps}{tag}/{'D' if e.degraded else 'ok'}"
                )
        print(f"seed {seed}: {'  '.join(cells)}", flush=True)


def stationary(seeds: int, n: int) -> None:
    print(f"## stationary well-specified models, 500-value chunks, default sampler, n = {n}: status (false flags)")
    for name in ("gmm", "lr3", "nig3", "ar1"):
        flags, worst = 0, 0
        for seed in range(seeds):
            rng = np.random.default_rng(1000 + seed)
            X = None
            if name == "gmm":
                y, fam = rng.normal(1.0, 1.5, n), GMM1
            elif name in ("lr3", "nig3"):
                X = rng.normal(size=(n, 3))
                y = X @ np.array([1.0, -0.5, 0.3]) + 0.2 + (1.0 if name == "lr3" else 0.7) * rng.normal(size=n)
                fam = ("linear_regression", {"features": 3} | ({} if name == "lr3" else {"noise_std": None}))
            else:
                y = np.zeros(n)
                for t in range(1, n):
                    y[t] = 0.1 + 0.6 * y[t - 1] + rng.normal()
                fam = ("autoregressive", {"order": 1})
            e = ModelEngine(*fam, {"seed": seed})
            steps = []
            for stop in range(500, n + 1, 500):
                a = e.observations
                (info,) = e.update(X[a:stop].tolist() if X is not None else None, y[a:stop].tolist())
                if a >= 2000:
                    steps.append(info.annealing_steps)
            flags += e.degraded is not None
            worst = max(worst, *steps)
            print(f"{name} seed {seed}: {status(e)}; annealing steps after the warm-up max {max(steps)}", flush=True)
        print(f"{name}: {flags} of {seeds} degraded; most annealing steps of a block after the warm-up {worst}")


#: The first block's sampler variants of the ``stepsize`` section.
STEP_VARIANTS = {
    "default": {},
    "burn_in 60": {"burn_in": 60},
    "lr 0.03": {"learning_rate": 0.03},
    "lr 0.01": {"learning_rate": 0.01},
    "lr 0.03, burn_in 60": {"learning_rate": 0.03, "burn_in": 60},
    "lr 0.01, burn_in 60": {"learning_rate": 0.01, "burn_in": 60},
}


def stepsize(seeds: int) -> None:
    """A normal–inverse-gamma regression like tests/models/test_evidence.py's: first-block variants at n = 500,
    then the finest one for the first block only and the defaults after it, to n = 2,000."""
    params = {"features": 3, "noise_std": None}

    def data(n: int) -> tuple[np.ndarray, np.ndarray, float]:
        rng = np.random.default_rng(100)
        X = rng.normal(size=(n, 3))
        y = X @ np.array([1.0, -0.5, 0.3]) + 0.2 + 0.7 * rng.normal(size=n)
        return X, y, LinearRegressionEvidence.for_params(params).update(X, y).log_evidence

    def summary(errs: list[float]) -> str:
        e = np.asarray(errs)
        return f"{e.mean():+.3f} ± {e.std(ddof=1) / math.sqrt(e.size):.3f} (sd {e.std(ddof=1):.3f})"

    print(f"## step-size bias, NIG regression d = 3, {seeds} seeds: log Ẑ − log Z mean ± SE")
    X, y, exact = data(500)
    for name, v in STEP_VARIANTS.items():
        errs, ses = [], []
        for seed in range(seeds):
            e = ModelEngine("linear_regression", params, {**v, "seed": seed})
            e.update(X.tolist(), y.tolist())
            errs.append(e.log_evidence - exact)
            ses.append(e.log_evidence_se)
        print(f"n = 500, {name}: {summary(errs)}, RMS SE {math.sqrt(np.mean(np.square(ses))):.3f}", flush=True)
    X, y, _ = data(2000)
    exact = {m: LinearRegressionEvidence.for_params(params).update(X[:m], y[:m]).log_evidence for m in (500, 2000)}
    for name in ("default", "lr 0.03, burn_in 60"):
        errs: dict[int, list[float]] = {500: [], 2000: []}
        cpu = 0.0
        for seed in range(seeds):
            e = ModelEngine("linear_regression", params, {**STEP_VARIANTS[name], "seed": seed})
            t0 = time.process_time()
            e.update(X[:500].tolist(), y[:500].tolist())
            cpu += time.process_time() - t0
            errs[500].append(e.log_evidence - exact[500])
            e.settings = SamplerSettings(seed=seed)  # the defaults after the first block
            e.update(X[500:].tolist(), y[500:].tolist())
            errs[2000].append(e.log_evidence - exact[2000])
        print(
            f"first block {name}, then defaults: n = 500 {summary(errs[500])}, n = 2000 {summary(errs[2000])}; "
            f"first block {cpu / seeds:.2f} CPU s per model",
            flush=True,
        )


def reservoir(seeds: int, n: int, capacity: int) -> None:
    print(f"## reservoir: history_capacity {capacity} vs the whole history, n={n}, log Ẑ − log Z (nats)")
    for name in ("gmm", "lr5"):
        for seed in range(seeds):
            rng = np.random.default_rng(seed)
            if name == "gmm":  # one-component gmm on N(0, 1)
                X, y = None, rng.normal(size=n)
            else:  # linear regression, 5 features, y = X·w + 0.5 + N(0, 1)
                X = rng.normal(size=(n, 5))
                y = X @ rng.normal(size=5) + 0.5 + rng.normal(size=n)
            for cap in (None, capacity):
                fam = GMM1 if name == "gmm" else ("linear_regression", {"features": 5})
                e = ModelEngine(*fam, {"seed": seed, "history_capacity": cap})
                t0 = time.perf_counter()
                errs = []
                for stop in range(n // 4, n + 1, n // 4):
                    a = e.observations
                    e.update(X[a:stop].tolist() if X is not None else None, y[a:stop].tolist())
                    if X is None:
                        exact = gmm_one_component_log_evidence(y[:stop])
                    else:
                        exact = LinearRegressionEvidence(5).update(X[:stop], y[:stop]).log_evidence
                    errs.append(f"n={stop}: {e.log_evidence - exact:+.2f}")
                seconds = time.perf_counter() - t0
                print(
                    f"{name} capacity {cap} seed {seed}: {', '.join(errs)}; {status(e)} ({seconds:.0f} s)", flush=True
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sections", nargs="*", default=["raw", "trigger", "merges", "drift", "stationary", "reservoir"])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--merge-seeds", type=int, default=100)
    ap.add_argument("--reanneal-steps", type=int, default=6, help="the merges section's reanneal_steps")
    ap.add_argument("--reservoir-n", type=int, default=20000)
    ap.add_argument("--stationary-n", type=int, default=10000)
    ap.add_argument("--capacity", type=int, default=500)
    a = ap.parse_args()
    for section in a.sections:
        if section == "raw":
            raw(a.seeds)
        elif section == "trigger":
            trigger(a.seeds)
        elif section == "merges":
            merges(a.merge_seeds, a.reanneal_steps)
            merges_with_moves(a.seeds)
        elif section == "drift":
            drift(a.seeds)
        elif section == "stepsize":
            stepsize(a.seeds)
        elif section == "stationary":
            stationary(a.seeds, a.stationary_n)
        elif section == "reservoir":
            reservoir(a.seeds, a.reservoir_n, a.capacity)
        else:
            ap.error(f"unknown section {section}")


if __name__ == "__main__":
    main()
