"""The Kubernetes manifests of ``deploy/k8s``, checked offline (no cluster, no network).

Each core resource is validated strictly (an unknown field is an error) against the Kubernetes
JSON schemas that the ``kubernetes-validate`` package ships, for the oldest and the newest
Kubernetes named in ``KUBERNETES``. The RayCluster is validated against
``deploy/k8s/schema/raycluster.schema.json`` (the fields used, from KubeRay 1.7.0's CRD) and its
pod templates against Kubernetes' PodTemplateSpec. Then come the names that tie the resources
together, the commands (checked by the parsers of the code that runs them), the probes (run
against a real TLS health server), the Secrets (documented in docs/DEPLOY.md) and the
Dockerfile. No test here applies anything to a cluster.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from concurrent import futures
from pathlib import Path
from urllib.parse import urlsplit

import grpc
import jsonschema
import kubernetes_validate
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from coordinator.__main__ import parse_args
from coordinator.settings import Settings
from deploy.tls import local_tls
from geopubsub.tools.cli import build_parser
from geopubsub.tools.cluster_cli import client_access
from geopubsub.tools.load_cli import run_load

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
RAYCLUSTER_SCHEMA = K8S / "schema" / "raycluster.schema.json"
DEPLOY_DOC = ROOT / "docs" / "DEPLOY.md"
KUBERNETES = ("1.30", "1.37")
"""The Kubernetes versions the core resources are validated for: the oldest one the manifests
claim and the newest whose schemas kubernetes-validate ships."""
IMAGE = "geopubsub:0.1.0"
NOT_CORE = {"RayCluster", "Kustomization"}
"""Kinds that are no Kubernetes core API: the CRD's, and kustomize's own file."""


# ---- reading -----------------------------------------------------------------------------------
@functools.cache
def _manifests() -> tuple[tuple[str, dict], ...]:
    """(file name, resource) of every YAML document in deploy/k8s, kustomization.yaml included."""
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc is not None:
                out.append((path.name, doc))
    return tuple(out)


def _all(kind: str) -> list[dict]:
    return [copy.deepcopy(doc) for _, doc in _manifests() if doc["kind"] == kind]


def _one(kind: str, name: str | None = None) -> dict:
    found = [d for d in _all(kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} named {name}"
    return found[0]


def _container(workload: dict, index: int = 0) -> dict:
    return workload["spec"]["template"]["spec"]["containers"][index]


def _env(container: dict) -> dict[str, str]:
    """A container's environment as Kubernetes gives it: a Secret's key stands for itself as
    ``secret.<name>.<key>``, and ``$(NAME)`` is replaced by NAME's value defined above it."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = _expand(var["value"], env)
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = f"secret.{ref['name']}.{ref['key']}"
    return env


def _expand(text: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), text)


def _script_commands(script: str) -> list[list[str]]:
    """The commands of a ``bash -c`` script of one command a line (``\\`` continues one)."""
    lines = script.replace("\\\n", " ").splitlines()
    return [shlex.split(line) for line in lines if line.strip() and line.strip() != "set -e"]


def _coordinator_commands() -> tuple[list[str], list[str]]:
    """The coordinator container's two commands: ``ray start ...`` and ``exec python -m
    coordinator ...``."""
    c = _container(_one("Deployment", "coordinator"))
    assert c["command"] == ["/bin/bash", "-c"]
    commands = _script_commands(c["args"][0])
    assert [cmd[:2] for cmd in commands] == [["ray", "start"], ["exec", "python"]], commands
    return commands[0], commands[1]


def _coordinator_settings():
    c = _container(_one("Deployment", "coordinator"))
    _, run = _coordinator_commands()
    assert run[:4] == ["exec", "python", "-m", "coordinator"]
    args = parse_args(run[4:])  # an unknown flag exits here
    flags = {k: v for k, v in vars(args).items() if k != "config"}
    return Settings.load(file=args.config, env=_env(c), flags=flags)


def _loader_argv() -> list[str]:
    c = _container(_one("Job", "loader"))
    return [_expand(a, _env(c)) for a in c["command"] + c["args"]]


def _mounts(workload_spec: dict, container: dict) -> dict[str, dict]:
    """Mount path -> the volume mounted there."""
    volumes = {v["name"]: v for v in workload_spec.get("volumes", [])}
    return {m["mountPath"]: volumes[m["name"]] for m in container.get("volumeMounts", [])}


def _secret_file(workload_spec: dict, container: dict, path: str) -> tuple[str, str]:
    """(Secret, key) of the file ``path`` as the container sees it."""
    for mount, volume in _mounts(workload_spec, container).items():
        if path.startswith(mount.rstrip("/") + "/") and "secret" in volume:
            name = path[len(mount.rstrip("/")) + 1 :]
            items = volume["secret"].get("items")
            key = next(i["key"] for i in items if i["path"] == name) if items else name
            return volume["secret"]["secretName"], key
    raise AssertionError(f"{path} is on no Secret volume")


def _raycluster_validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(RAYCLUSTER_SCHEMA.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _as_pod_template(template: dict) -> dict:
    """A RayCluster group's pod template as the core v1 PodTemplate that holds it."""
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": "group"},
        "template": template,
    }


def _ray_groups(rc: dict) -> list[dict]:
    return [rc["spec"]["headGroupSpec"], *rc["spec"]["workerGroupSpecs"]]


# ---- schemas -----------------------------------------------------------------------------------
def test_every_file_holds_resources_of_one_kind_with_a_name():
    kinds: dict[str, set[str]] = {}
    for name, doc in _manifests():
        assert {"apiVersion", "kind"} <= doc.keys(), name
        if doc["kind"] != "Kustomization":
            assert doc["metadata"]["name"], name
        kinds.setdefault(name, set()).add(doc["kind"])
    assert all(len(k) == 1 for k in kinds.values()), kinds
    expected = {"Namespace", "RayCluster", "Deployment", "Service", "StatefulSet", "Job"}
    assert expected <= {k for ks in kinds.values() for k in ks}


@pytest.mark.parametrize("version", KUBERNETES)
def test_every_core_resource_validates_strictly_against_the_kubernetes_schemas(version):
    core = [(name, doc) for name, doc in _manifests() if doc["kind"] not in NOT_CORE]
    assert len(core) >= 7
    for name, doc in core:
        try:
            assert kubernetes_validate.validate(doc, version, strict=True) == version
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{name}: {doc['kind']} {where}: {exc.message} (Kubernetes {version})")


@pytest.mark.parametrize("version", KUBERNETES)
def test_the_raycluster_validates_against_the_crd_schema_and_its_pods_against_kubernetes(version):
    rc = _one("RayCluster")
    _raycluster_validator().validate(rc)
    for group in _ray_groups(rc):
        kubernetes_validate.validate(_as_pod_template(group["template"]), version, strict=True)


def test_a_misspelled_field_or_a_wrong_type_is_rejected():
    deployment = _one("Deployment", "coordinator")
    misspelled = copy.deepcopy(deployment)
    c = _container(misspelled)
    c["imagee"] = c.pop("image")
    with pytest.raises(kubernetes_validate.ValidationError, match="imagee"):
        kubernetes_validate.validate(misspelled, KUBERNETES[0], strict=True)
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError) as exc:
        kubernetes_validate.validate(wrong_type, KUBERNETES[0], strict=True)
    assert list(exc.value.path) == ["spec", "replicas"]

    validator = _raycluster_validator()
    rc = _one("RayCluster")
    wrong_type = copy.deepcopy(rc)
    wrong_type["spec"]["workerGroupSpecs"][0]["replicas"] = "2"
    with pytest.raises(jsonschema.ValidationError) as exc:
        validator.validate(wrong_type)
    assert list(exc.value.path) == ["spec", "workerGroupSpecs", 0, "replicas"]
    misspelled = copy.deepcopy(rc)
    head = misspelled["spec"]["headGroupSpec"]
    head["rayStartParam"] = head.pop("rayStartParams")
    with pytest.raises(jsonschema.ValidationError, match="rayStartParam"):
        validator.validate(misspelled)
    not_a_string = copy.deepcopy(rc)
    not_a_string["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(not_a_string)
    # a group's pod template, as Kubernetes sees it
    template = copy.deepcopy(rc["spec"]["workerGroupSpecs"][0]["template"])
    template["spec"]["containers"][0]["resources"]["limit"] = {"cpu": "2"}
    with pytest.raises(kubernetes_validate.ValidationError, match="limit"):
        kubernetes_validate.validate(_as_pod_template(template), KUBERNETES[0], strict=True)


# ---- how the resources fit together --------------------------------------------------------------
def test_the_kustomization_lists_every_manifest_once_in_the_namespace_of_all():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    listed = kustomization["resources"]
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert len(listed) == len(set(listed))
    assert set(listed) == files
    assert not list(K8S.glob("*.yml"))
    namespace = _one("Namespace")["metadata"]["name"]
    assert kustomization["namespace"] == namespace == "geopubsub"
    for name, doc in _manifests():
        if doc["kind"] not in ("Namespace", "Kustomization"):
            assert doc["metadata"].get("namespace") == namespace, name


def test_each_service_selects_the_pods_of_one_workload_and_their_named_ports():
    workloads = [*_all("Deployment"), *_all("StatefulSet")]
    for w in workloads:
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert w["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for svc in _all("Service"):
        selector = svc["spec"]["selector"]
        chosen = [
            w
            for w in workloads
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(chosen) == 1, svc["metadata"]["name"]
        ports = {p["name"]: p["containerPort"] for p in _container(chosen[0]).get("ports", [])}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in ports, port
            assert port["port"] == ports[port["targetPort"]], port
    redis = _one("StatefulSet", "redis")
    governing = _one("Service", redis["spec"]["serviceName"])
    assert governing["spec"]["clusterIP"] == "None"


def test_the_coordinator_joins_the_head_service_of_the_raycluster():
    from ray.scripts.scripts import start

    rc = _one("RayCluster")
    head_service = f"{rc['metadata']['name']}-head-svc"  # KubeRay's name for it
    head = rc["spec"]["headGroupSpec"]
    gcs = {
        p["name"]: p["containerPort"] for p in head["template"]["spec"]["containers"][0]["ports"]
    }
    ray_start, _ = _coordinator_commands()
    params = start.make_context("ray start", ray_start[2:]).params  # an unknown flag raises
    assert params["address"] == f"{head_service}:{gcs['gcs-server']}"
    assert params["num_cpus"] == 0  # no shard on the coordinator's node
    settings = _coordinator_settings()
    assert settings.ray_address == params["address"]


def test_the_coordinators_settings_pass_its_own_checks_with_tls_and_auth_on():
    settings = _coordinator_settings()  # Settings refuses what it would refuse at start
    deployment = _one("Deployment", "coordinator")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    assert (settings.host, settings.port, settings.shards) == ("0.0.0.0", 50051, 4)
    assert settings.tls_on and settings.auth_on and not settings.insecure
    assert settings.metrics_host == "0.0.0.0" and settings.metrics_port == 9100
    spec = deployment["spec"]["template"]["spec"]
    c = _container(deployment)
    assert _secret_file(spec, c, settings.tls_cert) == ("geopubsub-tls", "tls.crt")
    assert _secret_file(spec, c, settings.tls_key) == ("geopubsub-tls", "tls.key")
    svc = _one("Service", "coordinator")
    ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
    assert ports == {"grpc": settings.port, "metrics": settings.metrics_port}
    annotations = svc["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(settings.metrics_port)
    assert annotations["prometheus.io/scheme"] == "https"  # TLS on: the endpoint serves HTTPS


def test_the_redis_urls_name_the_redis_service_and_the_password_secret():
    redis_svc = _one("Service", "redis")
    port = redis_svc["spec"]["ports"][0]["port"]
    password = "secret.geopubsub-redis.password"
    urls = {"coordinator": _coordinator_settings().redis_url}
    argv = _loader_argv()
    urls["loader"] = argv[argv.index("--redis-url") + 1]
    for who, url in urls.items():
        parts = urlsplit(url)
        assert (parts.hostname, parts.port, parts.password) == ("redis", port, password), who
    redis = _container(_one("StatefulSet", "redis"))
    assert _env(redis)["REDIS_PASSWORD"] == password
    script = redis["args"][0]
    assert "--appendonly yes" in script and "requirepass $REDIS_PASSWORD" in script
    assert "$REDIS_PASSWORD" not in script.split("<<")[0]  # on no command line


def test_the_loader_command_is_one_geopubsub_load_accepts_for_this_cluster(monkeypatch):
    job = _one("Job", "loader")
    assert job["spec"]["suspend"] is True  # started by hand once its input is there
    spec = job["spec"]["template"]["spec"]
    c = _container(job)
    argv = _loader_argv()
    assert argv[0] == "geopubsub"
    args = build_parser(argv[1:]).parse_args(argv[1:])  # an unknown flag exits here
    assert args.func is run_load
    coordinator = _coordinator_settings()
    svc = _one("Service", "coordinator")
    grpc_port = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc")
    assert args.coordinator == f"{svc['metadata']['name']}:{grpc_port}"
    assert args.shards == coordinator.shards
    cpus = int(c["resources"]["limits"]["cpu"])
    assert args.master == f"local[{cpus}]"
    pvc = _one("PersistentVolumeClaim", "loader-input")
    mounts = _mounts(spec, c)
    for path in args.inputs:
        mount = next(m for m in mounts if path.startswith(m.rstrip("/") + "/"))
        assert mounts[mount]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert _secret_file(spec, c, args.ca) == ("geopubsub-tls", "ca.crt")
    # the Reload: over TLS with that CA, the token from the environment
    for var in [v for v in os.environ if v.startswith("GEOPUBSUB_")]:
        monkeypatch.delenv(var)
    for name, value in _env(c).items():
        monkeypatch.setenv(name, value)
    endpoint = client_access(args, args.coordinator)
    assert endpoint.tls is not None and endpoint.tls.ca == args.ca
    assert endpoint.token == "secret.geopubsub-admin-token.token"


def test_the_raycluster_starts_ray_as_the_image_has_it():
    from ray.scripts.scripts import start

    rc = _one("RayCluster")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    pins = [d for d in pyproject["project"]["dependencies"] if d.startswith("ray==")]
    assert pins == [f"ray=={rc['spec']['rayVersion']}"]
    dockerfile = (K8S / "Dockerfile").read_text(encoding="utf-8")
    assert f'"ray[default]=={rc["spec"]["rayVersion"]}"' in dockerfile
    head, *workers = _ray_groups(rc)
    assert head["rayStartParams"]["num-cpus"] == "0"  # no shard on the head
    for i, group in enumerate([head, *workers]):
        flags = [f"--{k}={v}" for k, v in group["rayStartParams"].items()]
        start.make_context("ray start", (["--head"] if i == 0 else []) + flags)  # real options
        assert group["template"]["spec"]["containers"][0]["image"] == IMAGE
    assert sum(w["replicas"] for w in workers) >= 2
    for w in workers:
        assert 0 <= w["minReplicas"] <= w["replicas"] <= w["maxReplicas"]
        resources = w["template"]["spec"]["containers"][0]["resources"]
        assert resources["requests"] and resources["limits"]
    images = {
        c["image"]
        for kind in ("Deployment", "StatefulSet", "Job")
        for w in _all(kind)
        for c in w["spec"]["template"]["spec"]["containers"]
    }
    assert images == {IMAGE, "redis:7"}


def test_the_coordinators_probes_tell_serving_from_not_serving_over_tls(tmp_path):
    c = _container(_one("Deployment", "coordinator"))
    grpc_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
    target, ca = f"127.0.0.1:{grpc_port}", "/etc/geopubsub/tls/ca.crt"
    probes = {}
    for kind in ("readinessProbe", "livenessProbe"):
        command = c[kind]["exec"]["command"]
        assert command[0] == "python" and target in command[2] and ca in command[2]
        probes[kind] = command
    files = local_tls(tmp_path, ["coordinator"])  # a certificate for the Service's name only
    servicer = health.HealthServicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    credentials = grpc.ssl_server_credentials([(files.key.read_bytes(), files.cert.read_bytes())])
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()

    def probe(kind: str) -> int:
        code = probes[kind][2].replace(target, f"127.0.0.1:{port}").replace(ca, str(files.ca))
        return subprocess.run(
            [sys.executable, "-c", code], capture_output=True, timeout=60, cwd=ROOT
        ).returncode

    try:
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        assert (probe("readinessProbe"), probe("livenessProbe")) == (0, 0)
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert (probe("readinessProbe"), probe("livenessProbe")) == (1, 0)
    finally:
        server.stop(None).wait()
    assert probe("livenessProbe") != 0  # nothing answers


def test_every_secret_the_manifests_use_is_created_in_deploy_md():
    used: set[tuple[str, str]] = set()
    for kind in ("Deployment", "StatefulSet", "Job"):
        for w in _all(kind):
            for c in w["spec"]["template"]["spec"]["containers"]:
                for var in c.get("env", []):
                    ref = var.get("valueFrom", {}).get("secretKeyRef")
                    if ref:
                        used.add((ref["name"], ref["key"]))
            for volume in w["spec"]["template"]["spec"].get("volumes", []):
                for item in volume.get("secret", {}).get("items", []):
                    used.add((volume["secret"]["secretName"], item["key"]))
    settings = _coordinator_settings()
    deployment = _one("Deployment", "coordinator")
    spec, c = deployment["spec"]["template"]["spec"], _container(deployment)
    for path in (settings.tls_cert, settings.tls_key, "/etc/geopubsub/tls/ca.crt"):
        used.add(_secret_file(spec, c, path))
    assert {name for name, _ in used} == {
        "geopubsub-tls",
        "geopubsub-redis",
        "geopubsub-admin-token",
    }
    doc = DEPLOY_DOC.read_text(encoding="utf-8")
    section = doc.split("## On Kubernetes", 1)[1].split("\n## ", 1)[0]
    commands = [
        line for line in section.replace("\\\n", " ").splitlines() if "create secret" in line
    ]
    for name, key in sorted(used):
        assert any(
            f" {name} " in f"{line} "
            and re.search(rf"--from-(file|literal)={re.escape(key)}=", line)
            for line in commands
        ), f"docs/DEPLOY.md does not create Secret {name} with key {key}"
    # the certificate names the Service clients dial (the loader, the probes' server_name)
    assert "coordinator.geopubsub.svc" in section and "'coordinator'" in section


def test_the_dockerfile_copies_what_exists_and_brings_java_for_spark():
    lines = (K8S / "Dockerfile").read_text(encoding="utf-8").splitlines()
    assert lines[[i for i, x in enumerate(lines) if x.startswith("FROM")][0]].startswith(
        "FROM python:3.11-slim"
    )
    copies = [shlex.split(x)[1:-1] for x in lines if x.startswith("COPY ")]
    sources = [s for c in copies for s in c]
    assert sources and all((ROOT / s).exists() for s in sources), sources
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    packages = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {p.rstrip("*") for p in packages} <= set(sources)
    assert any("openjdk-17-jre-headless" in x for x in lines)
