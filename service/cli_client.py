"""Client-side ``sgais`` commands: ``demo``, ``models …``, ``post``, ``watch`` (they talk HTTP to a service)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from service.cli import app
from service.client import ApiError, SgaisClient

console = Console()

URL = typer.Option("http://127.0.0.1:8000", "--url", envvar="SGAIS_URL", help="service base URL")
API_KEY = typer.Option(None, "--api-key", envvar="SGAIS_API_KEY", help="bearer key (if the service has keys)")

models_app = typer.Typer(help="Create, list, show and delete models.", no_args_is_help=True)
app.add_typer(models_app, name="models")


def _client(url: str, api_key: str | None) -> SgaisClient:
    return SgaisClient(url, api_key)


def _fail(err: Exception) -> None:
    console.print(f"[red]error:[/red] {err}")
    raise typer.Exit(1)


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
    with _client(url, api_key) as c:
        try:
            m = c.create_model(
                name,
                family=family,
                params=_json_opt(params, "--params"),
                stream=stream,
                sampler=_json_opt(sampler, "--sampler"),
                prior_probability=prior,
                alerts=_json_opt(alerts, "--alerts"),
            )
        except ApiError as err:
            _fail(err)
    console.print_json(data=m)


@models_app.command("list")
def models_list(url: str = URL, api_key: str | None = API_KEY) -> None:
    """List the models of your tenant."""
    with _client(url, api_key) as c:
        try:
            items = c.list_models()
        except ApiError as err:
            _fail(err)
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
    with _client(url, api_key) as c:
        try:
            out = {"model": c.get_model(name), "evidence": c.evidence(name), "posterior": c.posterior(name)}
        except ApiError as err:
            _fail(err)
    console.print_json(data=out)


@models_app.command("delete")
def models_delete(name: str, url: str = URL, api_key: str | None = API_KEY) -> None:
    """Delete a model (its state, trace and alerts; the stream stays)."""
    with _client(url, api_key) as c:
        try:
            c.delete_model(name)
        except ApiError as err:
            _fail(err)
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
    first_seq: int = typer.Option(0, "--first-seq", help="seq of the first chunk (0 = send no seq)"),
    url: str = URL,
    api_key: str | None = API_KEY,
) -> None:
    """Post a CSV file to a stream in chunks, with a progress bar."""
    xs, ys = read_csv_columns(file, x_cols, y_col)
    with (
        _client(url, api_key) as c,
        Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=console,
        ) as progress,
    ):
        task = progress.add_task(f"{file.name} → {stream}", total=len(ys))
        for k, start in enumerate(range(0, len(ys), chunk_size)):
            seq = first_seq + k if first_seq else None
            try:
                c.post_chunk(
                    stream,
                    y=ys[start : start + chunk_size],
                    x=xs[start : start + chunk_size] if xs is not None else None,
                    seq=seq,
                )
            except ApiError as err:
                _fail(err)
            progress.advance(task, min(chunk_size, len(ys) - start))
    console.print(f"posted {len(ys)} observations to {stream}")


# ----- watch --------------------------------------------------------------------------------------
def format_event(ev: dict[str, Any]) -> str:
    """One line of rich markup for a live event."""
    kind = ev.get("type")
    if kind == "evidence":
        lb = ev.get("last_block") or {}
        return (
            f"[cyan]evidence[/cyan] {ev.get('model')}: n={ev.get('observations')} "
            f"log Z={ev.get('log_evidence', float('nan')):.3f} "
            f"(per obs {ev.get('log_evidence_per_observation', float('nan')):.4f}) "
            f"steps={lb.get('annealing_steps')} ess={lb.get('ess', float('nan')):.1f}"
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


@app.command("watch")
def watch(
    stream: str = typer.Argument(..., help="stream to watch"),
    url: str = URL,
    api_key: str | None = API_KEY,
) -> None:
    """Print a stream's live events (evidence, alerts, model probabilities) until Ctrl-C."""
    with _client(url, api_key) as c:
        try:
            for ev in c.events(stream):
                console.print(format_event(ev))
        except KeyboardInterrupt:
            pass
        except ApiError as err:
            _fail(err)


# ----- demo ---------------------------------------------------------------------------------------
@app.command("demo")
def demo(
    out: Path = typer.Option(Path("sgais-demo"), "--out", "-o", help="directory for plots and the summary"),
    quick: bool = typer.Option(False, "--quick", help="one series, two models (a smoke test)"),
    url: str | None = typer.Option(
        None, "--url", envvar="SGAIS_DEMO_URL", help="use a running service instead of starting one"
    ),
    api_key: str | None = API_KEY,
) -> None:
    """Run competing models on river's seven change-point series through the service; write plots."""
    from service.demo import run_demo

    run_demo(out, quick=quick, url=url, api_key=api_key, console=console)
