"""Many models on one worker, fed live over HTTP through a real ``sgais serve`` (issue 9, acceptance 1 and 2).

    python bench/many_models.py [--part gmm,ar] [--models 128] [--chunks 20] [--warm-chunks 0] [--ar-models 1000]
                                [--ar-chunks 4] [--load 0] [--workers 1] [--no-changepoints] [--paced]
                                [--lone-repeats 1] [--redis-url URL]

Part ``gmm`` (acceptance 1): ``--models`` one-component gmm models with different priors (variance shape and
scale, mean scale) and seeds on one stream, and one model alone on another stream, each fed the same
``--chunks`` 5-observation chunks (POSTed one after the other, no ``seq``) until every model has processed every
chunk (``bench/service_overhead.py: service_run``, the end seen on the live event socket).  Prints the one
model's milliseconds per block end to end (elapsed / chunks; target <= 20) with its engine's share (the median of
its trace rows' ``seconds``: the rest is the service's per-chunk latency), the aggregate model-blocks/s of the
many (models x chunks / elapsed) against the one alone in the same run (target >= 30x), and every model's final
log-evidence against its exact normal-inverse-gamma value (``models.conjugate``; target within 5 nats).
With ``--warm-chunks W`` both streams first absorb W chunks, untimed, and the timed ``--chunks`` follow: the
sustained rate of live models past a stream's first values, where the populations are still wide (the warm-up:
more SGHMC moves per block, and change-point challengers started at 10, 20, 40, 80 values into the segment).
With ``--paced`` each timed chunk is posted once every model has processed the one before, as a live feed arrives
(without it the chunks are posted back to back and the worker reads several of a model's chunks at a time); the
elapsed time is then the sum of the chunks' own, and the CPU per model-block of each process is what to compare.
With ``--lone-repeats N`` the lone model is timed N times in all, the extra runs on fresh streams after the many: on a
machine whose speed drifts, one lone run can be half or twice another (session 39: 8.6 to 20.4 ms per block), and the
ratio with it; the ratio to the first run stays acceptance 1's, the one to the runs' median is printed beside it.

Part ``ar`` (acceptance 2): ``--ar-models`` AR(1) models on one stream and one worker, fed ``--ar-chunks``
5-observation chunks: sustained model-blocks/s over the chunks after the first (the first includes the
stream's single-observation blocks and the challengers' start) and the server's resident memory per model
(RSS of the server process tree after the run minus before the models were created, / models).

``--load N`` runs N CPU-bound processes beside the run (a loaded machine); ``--workers N`` starts the server with N
worker processes (``sgais serve --workers N``; the models split over them by their leases).  Models are registered
with their default alerts, so each runs its change-point challengers (``--no-changepoints`` turns them off).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import statistics
import tempfile
import time

import httpx
import psutil
import torch
from service_overhead import free_port, service_run, start_server

from models.conjugate import gmm_one_component_log_evidence

CHUNK = 5


def gmm_model(i: int, changepoints: bool = True) -> dict:
    """One-component gmm, model ``i`` of the stack: its own prior and seed."""
    params = {
        "dim": 1,
        "components": 1,
        "variance_shape": 1.0 + 0.5 * (i % 5),
        "variance_scale": 0.5 + 0.25 * (i % 7),
        "mean_scale": 1.0 + (i % 8),
    }
    body = {"family": "gmm", "params": params, "sampler": {"seed": i}}
    if not changepoints:
        body["alerts"] = {"change_point": {"enabled": False}}
    return body


def ar_model(i: int, changepoints: bool = True) -> dict:
    body = {"family": "autoregressive", "params": {"order": 1}, "sampler": {"seed": i}}
    if not changepoints:
        body["alerts"] = {"change_point": {"enabled": False}}
    return body


def gmm_chunks(n: int, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [{"y": (0.3 + torch.randn(CHUNK, generator=g, dtype=torch.float64)).tolist()} for _ in range(n)]


def ar_chunks(n: int, seed: int = 1) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(n * CHUNK, generator=g, dtype=torch.float64)
    y, prev = [], 0.0
    for v in e.tolist():
        prev = 0.2 + 0.6 * prev + 0.5 * v
        y.append(prev)
    return [{"y": y[i * CHUNK : (i + 1) * CHUNK]} for i in range(n)]


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and its descendants (Linux /proc), bytes."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except FileNotFoundError:
            continue
    return total


def cpu_by_role(pid: int, data_dir: str) -> dict[str, float]:
    """CPU seconds (user + system) of ``sgais serve`` (``pid``: the API) and its children, by role: ``api``,
    ``worker`` (``workers.runner``), ``redis`` (the embedded ``redis-server``, daemonised: found by its working
    directory, the server's ``data_dir``); an external Redis (``--redis-url``) is not seen."""
    out = {"api": 0.0, "worker": 0.0, "redis": 0.0}
    root = psutil.Process(pid)
    embedded = [
        p
        for p in psutil.process_iter(["name", "cwd"])
        if p.info["name"] == "redis-server" and p.info["cwd"] == os.path.realpath(data_dir)
    ]
    for p in [root, *root.children(recursive=True), *embedded]:
        try:
            t = p.cpu_times()
            cmd = " ".join(p.cmdline())
        except psutil.NoSuchProcess:
            continue
        role = "redis" if "redis-server" in cmd else "worker" if "workers.runner" in cmd else "api"
        out[role] += t.user + t.system
    return out


def cpu_per_model_block(before: dict[str, float], after: dict[str, float], model_blocks: int) -> dict[str, float]:
    """Milliseconds of CPU per model-block of each role between two :func:`cpu_by_role` readings."""
    return {k: 1000 * (after[k] - before[k]) / model_blocks for k in before}


def _cpu_text(cpu: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f} ms" for k, v in cpu.items())


def _spin() -> None:
    while True:
        pass


def part_gmm(
    base: str,
    server_pid: int,
    data_dir: str,
    tag: str,
    n_models: int,
    n_chunks: int,
    changepoints: bool,
    warm_chunks: int = 0,
    paced: bool = False,
    lone_repeats: int = 1,
) -> dict:
    data = gmm_chunks(warm_chunks + n_chunks)
    early, timed = data[:warm_chunks], data[warm_chunks:]
    os.environ["BENCH_KEEP_MODELS"] = "1"

    def fn(i: int) -> dict:
        return gmm_model(i, changepoints)

    def run(stream: str, n: int) -> tuple[float, dict[str, float]]:
        """Seconds for the timed chunks, after the untimed ``warm_chunks``, and the service's CPU per model-block
        from the models' registration (without warm chunks) or from the end of the warm chunks."""
        if early:
            service_run(base, stream, early, n, in_flight=1, model_fn=fn)
        cpu0 = cpu_by_role(server_pid, data_dir)
        if paced:  # each chunk posted once every model has processed the one before (a live feed)
            t = 0.0
            for j, chunk in enumerate(timed):
                t += service_run(base, stream, [chunk], n, in_flight=1, model_fn=fn,
                                 register=not early and j == 0, processed_before=len(early) + j)[0]  # fmt: skip
        else:
            t = service_run(
                base, stream, timed, n, in_flight=1, model_fn=fn, register=not early, processed_before=len(early)
            )[0]
        return t, cpu_per_model_block(cpu0, cpu_by_role(server_pid, data_dir), n * n_chunks)

    service_run(base, f"warm-{tag}", data[:3], 1, in_flight=1, model_fn=fn)  # the worker's lazy imports
    t_one, _ = run(f"one-{tag}", 1)
    t_many, cpu = run(f"many-{tag}", n_models)
    # the lone model again on fresh streams after the many (--lone-repeats): how far one lone run is from another
    t_ones = [t_one] + [run(f"one{j}-{tag}", 1)[0] for j in range(1, lone_repeats)]
    y = [v for c in data for v in c["y"]]
    errors, statuses = [], {}
    with httpx.Client(base_url=base, timeout=60) as client:
        # the one model's engine time per timed block, from its trace (the worker's own clock around the engine)
        trace = client.get(f"/v1/models/one-{tag}-m0/trace", params={"limit": 10_000}).json()["items"]
        engine_ms = statistics.median(1000 * row["seconds"] for row in trace[-n_chunks:])
        for stream, n in ((f"one-{tag}", 1), (f"many-{tag}", n_models)):
            for i in range(n):
                ev = client.get(f"/v1/models/{stream}-m{i}/evidence").json()
                p = fn(i)["params"]
                exact = gmm_one_component_log_evidence(y, p["variance_shape"], p["variance_scale"], p["mean_scale"])
                errors.append(ev["log_evidence"] - exact)
                statuses[ev["status"]] = statuses.get(ev["status"], 0) + 1
            client.delete(f"/v1/streams/{stream}").raise_for_status()
        for j in range(1, lone_repeats):
            client.delete(f"/v1/streams/one{j}-{tag}").raise_for_status()
    one_rate, many_rate = n_chunks / t_one, n_models * n_chunks / t_many
    median_one = statistics.median(t_ones)
    return {
        "one_ms_per_block": 1000 * t_one / n_chunks,
        "one_engine_ms_per_block": engine_ms,
        "one_blocks_per_s": one_rate,
        "many_model_blocks_per_s": many_rate,
        "many_ms_per_model_block": 1000 * t_many / (n_models * n_chunks),
        "ratio": many_rate / one_rate,
        "one_ms_per_block_runs": [1000 * t / n_chunks for t in t_ones],
        "ratio_to_median_one": many_rate / (n_chunks / median_one),
        "max_abs_error_nats": max(abs(e) for e in errors),
        "mean_error_nats": sum(errors) / len(errors),
        "within_5_nats": sum(abs(e) <= 5 for e in errors),
        "models_checked": len(errors),
        "statuses": statuses,
        "many_cpu_ms_per_model_block": cpu,
    }


def part_ar(
    base: str, server_pid: int, data_dir: str, tag: str, n_models: int, n_chunks: int, changepoints: bool
) -> dict:
    data = ar_chunks(n_chunks)
    stream = f"ar-{tag}"
    rss0 = rss_bytes(server_pid)
    os.environ["BENCH_KEEP_MODELS"] = "1"
    # the first chunk (single-observation blocks, challengers starting) apart; then the sustained rate
    t_first, _ = service_run(base, stream, data[:1], n_models, in_flight=1,
                             model_fn=lambda i: ar_model(i, changepoints))  # fmt: skip
    cpu0 = cpu_by_role(server_pid, data_dir)
    t0 = time.perf_counter()
    with httpx.Client(base_url=base, timeout=60) as client:
        for c in data[1:]:
            client.post(f"/v1/streams/{stream}/chunks", json=c).raise_for_status()
        while True:
            body = client.get(f"/v1/streams/{stream}").json()
            if all(m["chunks_processed"] == n_chunks for m in body["models"]):
                break
            time.sleep(0.2)
        elapsed = time.perf_counter() - t0
        cpu = cpu_per_model_block(cpu0, cpu_by_role(server_pid, data_dir), n_models * (n_chunks - 1))
        rss1 = rss_bytes(server_pid)
        client.delete(f"/v1/streams/{stream}").raise_for_status()
    rest = n_chunks - 1
    return {
        "first_chunk_s": t_first,
        "cpu_ms_per_model_block": cpu,
        "sustained_model_blocks_per_s": n_models * rest / elapsed if rest else math.nan,
        "sustained_s_per_round": elapsed / rest if rest else math.nan,
        "rss_mb_before": rss0 / 2**20,
        "rss_mb_after": rss1 / 2**20,
        "kb_per_model": (rss1 - rss0) / 1024 / n_models,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="gmm,ar")
    ap.add_argument("--models", type=int, default=128)
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument(
        "--warm-chunks",
        type=int,
        default=0,
        help="gmm: chunks posted and processed before the timed --chunks (sustained rate after a stream's start)",
    )
    ap.add_argument(
        "--paced",
        action="store_true",
        help="post each timed chunk once every model has processed the one before (a live feed; the default posts "
        "them back to back and the worker reads them in batches)",
    )
    ap.add_argument(
        "--lone-repeats",
        type=int,
        default=1,
        help="gmm: time the lone model this many times in all (the extra runs on fresh streams after the many) and "
        "print the ratio to their median beside the acceptance's ratio to the first",
    )
    ap.add_argument("--ar-models", type=int, default=1000)
    ap.add_argument("--ar-chunks", type=int, default=4)
    ap.add_argument("--load", type=int, default=0, help="CPU-bound processes beside the run")
    ap.add_argument("--no-changepoints", action="store_true")
    ap.add_argument("--workers", type=int, default=1, help="worker processes of the server (sgais serve --workers)")
    ap.add_argument("--redis-url", default=None)
    ap.add_argument("--json", default=None, help="write the results here too")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cps = not args.no_changepoints
    port = free_port()
    results: dict = {"args": vars(args)}
    hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.load)]
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(port, args.redis_url, tmp, args.workers)
        base = f"http://127.0.0.1:{port}"
        for h in hogs:
            h.start()
        try:
            tag = f"{args.load}-{int(time.time())}"
            if "gmm" in args.part:
                r = part_gmm(
                    base, server.pid, tmp, tag, args.models, args.chunks, cps, args.warm_chunks, args.paced,
                    args.lone_repeats,
                )  # fmt: skip
                results["gmm"] = r
                print(
                    f"gmm load={args.load} workers={args.workers} changepoints={cps} warm_chunks={args.warm_chunks} "
                    f"paced={args.paced}: "
                    f"one model {r['one_ms_per_block']:.1f} ms/block "
                    f"({r['one_blocks_per_s']:.1f} blocks/s; its engine {r['one_engine_ms_per_block']:.1f} ms, the "
                    f"trace's median); {args.models} models "
                    f"{r['many_model_blocks_per_s']:.1f} model-blocks/s ({r['many_ms_per_model_block']:.2f} ms per "
                    f"model-block) = {r['ratio']:.1f}x one"
                    f"{' (paced: latency-bound, not acceptance 1)' if args.paced else ''}; "
                    f"log-evidence vs exact: max |err| "
                    f"{r['max_abs_error_nats']:.2f} nats, mean {r['mean_error_nats']:+.2f}, "
                    f"{r['within_5_nats']}/{r['models_checked']} within 5 nats; statuses {r['statuses']}; "
                    f"CPU per model-block of the many: {_cpu_text(r['many_cpu_ms_per_model_block'])}",
                    flush=True,
                )
                if args.lone_repeats > 1:
                    runs = ", ".join(f"{v:.1f}" for v in r["one_ms_per_block_runs"])
                    print(f"  the lone model's runs: {runs} ms/block; the {args.models} models against their median: "
                          f"{r['ratio_to_median_one']:.1f}x", flush=True)  # fmt: skip
            if "ar" in args.part:
                r = part_ar(base, server.pid, tmp, tag, args.ar_models, args.ar_chunks, cps)
                results["ar"] = r
                print(
                    f"ar load={args.load} changepoints={cps}: {args.ar_models} AR(1) models, first chunk "
                    f"{r['first_chunk_s']:.1f} s, then {r['sustained_model_blocks_per_s']:.1f} model-blocks/s "
                    f"({r['sustained_s_per_round']:.2f} s per chunk of all models); server RSS "
                    f"{r['rss_mb_before']:.0f} -> {r['rss_mb_after']:.0f} MB = {r['kb_per_model']:.0f} kB per model; "
                    f"CPU per model-block: {_cpu_text(r['cpu_ms_per_model_block'])}",
                    flush=True,
                )
        finally:
            for h in hogs:
                h.kill()
            server.terminate()
            server.wait(30)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
