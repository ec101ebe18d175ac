"""Client-side ``sgais`` commands: ``demo``, ``models …``, ``post``, ``watch`` (they talk HTTP to a service)."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from service.cli import app
from service.cli_common import API_KEY, URL, _client, _fail, console, handled
from service.client import ApiError, SgaisClient

models_app = typer.Typer(help="Create, list, show and delete models.", no_args_is_help=True)
app.add_typer(models_app, name="models")


def _json_opt(text: str | None, what: str) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise typer.BadParameter(f"{what} is not JSON: {err}") from None
    if not isinstance(value, dict):
        raise typer.BadParameter(f"{what} must be a JSON object")
    return value


# ----- models -------------------------------------------------------------------------------------
@models_app.command("create")
def models_create(
    name: str = typer.Argument(..., help="model name"),
    family: str = typer.Option(..., "--family", "-f", help="model family, e.g. autoregressive, gmm"),
    params: str | None = typer.Option(None, "--params", "-p", help="hyperparameters as JSON, e.g. '{\"order\": 1}'"),
    stream: str | None = typer.Option(None, "--stream", "-s", help="stream (default: the model's name)"),
    sampler: str | None = typer.Option(None, "--sampler", help="SGAIS settings as JSON"),
    prior: float | None = typer.Option(None, "--prior", help="prior probability weight (default 1)"),
    alerts: str | None = typer.Option(None, "--alerts", help="alert settings as JSON"),
    url: str = URL,
    api_key: str | None = API_KEY,
) -> None:
    """Register a model on a stream."""
    with _client(url, api_key) as c, handled(url):
        m = c.create_model(
            name,
            family=family,
            params=_json_opt(params, "--params"),
            stream=stream,
            sampler=_json_opt(sampler, "--sampler"),
            prior_probability=prior,
            alerts=_json_opt(alerts, "--alerts"),
        )
    console.print_json(data=m)


@models_app.command("list")
def models_list(url: str = URL, api_key: str | None = API_KEY) -> None:
    """List the models of your tenant."""
    with _client(url, api_key) as c, handled(url):
        items = c.list_models()
    table = Table("name", "stream", "family", "params", "prior", "created")
    for m in items:
        table.add_row(
            m["name"],
            m["stream"],
            m["family"],
            json.dumps(m["params"]),
            f"{m.get('prior_probability', 1.0):g}",
            str(m.get("created_at", "")),
        )
    console.print(table)


@models_app.command("show")
def models_show(name: str, url: str = URL, api_key: str | None = API_KEY) -> None:
    """A model, its evidence and its posterior summary."""
    with _client(url, api_key) as c, handled(url):
        out = {"model": c.get_model(name), "evidence": c.evidence(name), "posterior": c.posterior(name)}
    console.print_json(data=out)


@models_app.command("delete")
def models_delete(name: str, url: str = URL, api_key: str | None = API_KEY) -> None:
    """Delete a model (its state, trace and alerts; the stream stays)."""
    with _client(url, api_key) as c, handled(url):
        c.delete_model(name)
    console.print(f"deleted {name}")


# ----- post ---------------------------------------------------------------------------------------
def read_csv_columns(path: Path, x_cols: list[str] | None, y_cols: list[str] | None) -> tuple[list | None, list]:
    """Read ``x`` rows and ``y`` values from a CSV with a header.

    ``y_cols`` default: the last column; one column gives scalar observations, several give
    vectors. Raises ``typer.BadParameter`` on unknown columns or non-numeric cells.
    """
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        y_cols = y_cols or [header[-1]]
        for col in [*(x_cols or []), *y_cols]:
            if col not in header:
                raise typer.BadParameter(f"column {col!r} not in {header}")
        xs, ys = [], []
        for i, row in enumerate(reader, start=2):
            try:
                yv = [float(row[c]) for c in y_cols]
                ys.append(yv[0] if len(yv) == 1 else yv)
                if x_cols:
                    xs.append([float(row[c]) for c in x_cols])
            except (TypeError, ValueError):
                raise typer.BadParameter(f"{path}:{i}: non-numeric value in {row}") from None
    return (xs if x_cols else None), ys


@app.command("post")
def post(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="CSV file with a header row"),
    stream: str = typer.Option(..., "--stream", "-s", help="stream to post to"),
    x_cols: list[str] | None = typer.Option(None, "--x-cols", "-x", help="covariate column (repeat for several)"),
    y_col: list[str] | None = typer.Option(None, "--y-col", "-y", help="observation column (repeat for a vector)"),
    chunk_size: int = typer.Option(500, "--chunk-size", min=1, help="observations per chunk"),
    first_seq: int | None = typer.Option(
        None,
        "--first-seq",
        min=1,
        help="seq of the file's first chunk (default 1: the file is the stream from its start)",
    ),
    append: bool = typer.Option(
        False, "--append", help="add the file after the stream's current chunks (a re-run appends it again)"
    ),
    url: str = URL,
    api_key: str | None = API_KEY,
) -> None:
    """Post a CSV file to a stream in chunks with sequence numbers, continuing where the stream is.

    By default the file's chunk k is the stream's chunk k: chunks the stream already holds are checked (the
    observation count, and the last one re-sent must be a duplicate) and skipped, so a re-run or a run after
    a failure never doubles data. ``--append`` adds the file after the stream's current chunks instead;
    ``--first-seq N`` numbers the file's chunks from N.
    """
    xs, ys = read_csv_columns(file, x_cols, y_col)
    starts = list(range(0, len(ys), chunk_size))

    def body(k: int) -> dict[str, Any]:
        lo = starts[k]
        return {"y": ys[lo : lo + chunk_size], "x": xs[lo : lo + chunk_size] if xs is not None else None}

    with _client(url, api_key) as c, handled(url):
        held = c.stream(stream)
        if append and first_seq is not None:
            raise typer.BadParameter("give --append or --first-seq, not both")
        base = held["chunks"] if append else (first_seq or 1) - 1  # seq of chunk k is base + k + 1
        skip = 0
        if not append and first_seq is None and held["chunks"]:
            skip = _already_posted(c, stream, held, starts, ys, body, chunk_size)
        posted = duplicates = 0
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=console,
        ) as progress:
            task = progress.add_task(f"{file.name} → {stream}", total=len(ys))
            progress.advance(task, min(skip * chunk_size, len(ys)))
            for k in range(skip, len(starts)):
                b = body(k)
                ack = c.post_chunk(stream, y=b["y"], x=b["x"], seq=base + k + 1)
                if ack.get("duplicate"):
                    duplicates += len(b["y"])
                else:
                    posted += len(b["y"])
                progress.advance(task, len(b["y"]))
    held_rows = sum(len(body(k)["y"]) for k in range(skip)) + duplicates
    note = f" ({held_rows} already on the stream)" if held_rows else ""
    console.print(f"posted {posted} observations to {stream}{note}")


def _already_posted(c: SgaisClient, stream: str, held: dict, starts: list[int], ys: list, body, chunk_size: int) -> int:
    """How many leading chunks of the file the stream already holds (the file is the stream from seq 1).

    Checks that the stream's observation count matches the file's first ``chunks`` chunks and that
    re-sending the last of them is a duplicate; otherwise one-line error (the stream holds other data).
    """
    n = held["chunks"]
    if n > len(starts):
        _fail(
            ValueError(
                f"stream {stream!r} has {n} chunks, more than the file's {len(starts)}: "
                "it holds other data (use --append or --first-seq)"
            )
        )
    rows = sum(len(body(k)["y"]) for k in range(n))
    if rows != held["observations"]:
        _fail(
            ValueError(
                f"stream {stream!r} holds {held['observations']} observations in {n} chunks, the file's "
                f"first {n} chunks of {chunk_size} have {rows}: other data or another --chunk-size "
                "(use --append to add the file after it)"
            )
        )
    last = body(n - 1)
    try:
        ack = c.post_chunk(stream, y=last["y"], x=last["x"], seq=n)
    except ApiError as err:
        if err.status == 409:
            _fail(
                ValueError(
                    f"stream {stream!r}: its chunk {n} differs from the file's (use --append to add the "
                    "file after the stream's data)"
                )
            )
        raise
    if not ack.get("duplicate"):  # cannot happen: seq n is accepted already
        _fail(ValueError(f"stream {stream!r}: chunk {n} was not a duplicate"))
    return n


# ----- watch --------------------------------------------------------------------------------------
def format_event(ev: dict[str, Any]) -> str:
    """One line of rich markup for a live event."""
    kind = ev.get("type")
    if kind == "evidence":
        lb = ev.get("last_block") or {}
        status = "" if ev.get("status") in (None, "ok") else f" [yellow]{ev['status']}[/yellow]"
        return (
            f"[cyan]evidence[/cyan] {ev.get('model')}: n={ev.get('observations')} "
            f"log Z={_num(ev.get('log_evidence'), '.3f')} "
            f"(per obs {_num(ev.get('log_evidence_per_observation'), '.4f')}) "
            f"steps={lb.get('annealing_steps')} ess={_num(lb.get('ess'), '.1f')}{status}"
        )
    if kind == "alert":
        return (
            f"[bold red]ALERT {ev.get('kind')}[/bold red] {ev.get('model')}: change at "
            f"{ev.get('observation_index')} (detected at {ev.get('detected_at_index')}, "
            f"score {ev.get('score', 0):.3g}) {ev.get('message', '')}"
        )
    if kind == "posterior":
        probs = ", ".join(
            f"{m['model']}={m['probability']:.3f}"
            if m.get("probability") is not None
            else f"{m['model']}={m['status']}"
            for m in ev.get("models", [])
        )
        return f"[green]posterior[/green] n={ev.get('observations')}: {probs}"
    return json.dumps(ev)


def _num(v: float | None, spec: str) -> str:
    """``v`` formatted, or ``-`` when absent (a model without data has no per-observation evidence)."""
    return "-" if v is None else format(v, spec)


@app.command("watch")
def watch(
    stream: str = typer.Argument(..., help="stream to watch"),
    timeout: float | None = typer.Option(
        None, "--timeout", min=0, help="stop after this many seconds without news (default: until Ctrl-C)"
    ),
    url: str = URL,
    api_key: str | None = API_KEY,
) -> None:
    """Print a stream's current state (evidence, probabilities, recent alerts), then its live events.

    A stream that does not exist yet is waited for (a model created on it creates it).
    """
    with _client(url, api_key) as c, handled(url):
        try:
            _wait_for_stream(c, stream, timeout)
            for line in current_state(c, stream):
                console.print(line, soft_wrap=True)
            for ev in c.events(stream, timeout=timeout):
                console.print(format_event(ev), soft_wrap=True)
        except KeyboardInterrupt:
            pass


def _wait_for_stream(c: SgaisClient, stream: str, timeout: float | None) -> None:
    deadline = None if timeout is None else time.monotonic() + timeout
    said = False
    while True:
        try:
            c.stream(stream)
            return
        except ApiError as err:
            if err.status != 404:
                raise
        if not said:
            console.print(f"waiting for stream {stream} to exist (create a model on it) ...")
            said = True
        if deadline is not None and time.monotonic() > deadline:
            _fail(ValueError(f"stream {stream!r} did not appear within {timeout:g} s"))
        time.sleep(1.0)


def current_state(c: SgaisClient, stream: str, recent_alerts: int = 5) -> list[str]:
    """Lines of rich markup: each model's evidence, the stream posterior and the last alerts."""
    st = c.stream(stream)
    lines = [f"[bold]{stream}[/bold]: {st['observations']} observations in {st['chunks']} chunks"]
    for m in st["models"]:
        lines.append(format_event({"type": "evidence", **c.evidence(m["name"])}))
    post = c.stream_posterior(stream)
    if post["models"]:
        lines.append(format_event({"type": "posterior", **post}))
    for a in c.alerts(stream=stream)[-recent_alerts:]:
        lines.append(format_event({"type": "alert", **a}))
    return lines


# ----- demo ---------------------------------------------------------------------------------------
@app.command("demo")
def demo(
    out: Path = typer.Option(Path("sgais-demo"), "--out", "-o", help="directory for plots and the summary"),
    quick: bool = typer.Option(False, "--quick", help="one series, two models (a smoke test)"),
    url: str | None = typer.Option(
        None, "--url", envvar="SGAIS_DEMO_URL", help="use a running service instead of starting one"
    ),
    api_key: str | None = API_KEY,
    timeout: float = typer.Option(
        600.0,
        "--timeout",
        help="seconds from the command's start before reporting what is done (the full demo takes 19-112 s on a "
        "quiet 2-core machine, 27-185 s beside two CPU-bound processes, sessions 13-31; machines differ); "
        "exit code 1 if incomplete, the plots and "
        "summary then show what was absorbed",
    ),
) -> None:
    """Run competing models on river's seven change-point series through the service; write plots."""
    from service.demo import run_demo

    result = run_demo(out, quick=quick, url=url, api_key=api_key, console=console, timeout=timeout)
    if result["missing"]:
        raise typer.Exit(1)
