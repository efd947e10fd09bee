"""deploy/kubernetes: every manifest parses and carries the fields a cluster needs, and its
ports, probes, config and commands agree with the router, the replayer and each other."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from router.config.parse import load_config
from tests.deploy.manifests import (
    KUBE,
    Manifest,
    container_port,
    expand,
    flag,
    load_manifests,
    matches,
    one,
)
from tests.procs import ROOT, start_emulator
from tests.router.harness import base_config, start_router, write_config

MANIFESTS = load_manifests()
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
ROUTER_EXIT = 1.0  # the router exits within drain_seconds + this (test_hardening_lifecycle)
GRACE_MARGIN = 2.0  # what terminationGracePeriodSeconds must keep beyond that and preStop

DEPLOYMENT = one(MANIFESTS, "Deployment", "turnout")
POD: dict[str, Any] = DEPLOYMENT.doc["spec"]["template"]
ROUTER = POD["spec"]["containers"][0]
SERVICE = one(MANIFESTS, "Service", "turnout")
CONFIGMAP = one(MANIFESTS, "ConfigMap")


def router_argv() -> list[str]:
    argv: list[str] = [*ROUTER.get("command", []), *ROUTER.get("args", [])]
    assert argv, "the router container states its command (the image's CMD, spelled out)"
    return argv


def configmap_file(tmp_path: Path) -> Path:
    """The ConfigMap's router.yaml, written out as the pod would see it."""
    path = tmp_path / "router.yaml"
    path.write_text(CONFIGMAP.doc["data"]["router.yaml"], encoding="utf-8")
    return path


def router_port(tmp_path: Path) -> int:
    """--port if given, else the ConfigMap's listen.port."""
    argv = router_argv()
    if "--port" in argv:
        return int(flag(argv, "--port"))
    return load_config(configmap_file(tmp_path)).listen.port


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "turnout", "check-config", str(path)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("m", MANIFESTS, ids=lambda m: f"{m.path.name}:{m.kind}")
def test_every_manifest_has_the_basic_fields(m: Manifest) -> None:
    assert m.doc.get("apiVersion") and m.doc.get("kind")
    if m.kind == "Kustomization":
        return
    assert m.name
    labels = m.doc["metadata"].get("labels", {})
    assert labels.get("app.kubernetes.io/name") == "turnout"


def test_kustomization_lists_existing_files_and_the_router_objects() -> None:
    k = one(MANIFESTS, "Kustomization")
    resources = k.doc["resources"]
    assert all((KUBE / r).is_file() for r in resources)
    applied = {m.kind for m in MANIFESTS if m.path.name in resources}  # by kubectl apply -k
    assert applied >= {"ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler"}
    assert "PodDisruptionBudget" in applied


def test_deployment_replicas_resources_and_command() -> None:
    spec = DEPLOYMENT.doc["spec"]
    assert spec["replicas"] >= 2
    assert matches(spec["selector"]["matchLabels"], POD["metadata"]["labels"])
    requests = ROUTER["resources"]["requests"]
    assert requests.get("cpu") and requests.get("memory")
    argv = router_argv()
    assert argv[0] in SCRIPTS and argv[1] == "serve"
    assert "--workers" not in argv, "one worker per pod keeps each pod's /metrics exact"
    assert flag(argv, "--host") == "0.0.0.0", "probes and the Service reach the pod's IP"
    assert POD["spec"]["securityContext"]["runAsNonRoot"] is True


def test_ports_and_probes_match_the_router(tmp_path: Path) -> None:
    port = router_port(tmp_path)
    assert port in [p["containerPort"] for p in ROUTER["ports"]]
    ready, live = ROUTER["readinessProbe"]["httpGet"], ROUTER["livenessProbe"]["httpGet"]
    assert ready["path"] == "/ready" and container_port(ROUTER, ready["port"]) == port
    assert live["path"] == "/health" and container_port(ROUTER, live["port"]) == port
    (svc_port,) = SERVICE.doc["spec"]["ports"]
    assert container_port(ROUTER, svc_port["targetPort"]) == port
    assert matches(SERVICE.doc["spec"]["selector"], POD["metadata"]["labels"])


def test_config_is_mounted_where_the_router_reads_it() -> None:
    config = Path(flag(router_argv(), "--config"))
    mounts = {v["mountPath"]: v["name"] for v in ROUTER["volumeMounts"]}
    volume = mounts[str(config.parent)]
    (source,) = [v for v in POD["spec"]["volumes"] if v["name"] == volume]
    assert source["configMap"]["name"] == CONFIGMAP.name
    assert config.name in CONFIGMAP.doc["data"]


def test_termination_grace_covers_prestop_and_the_drain(tmp_path: Path) -> None:
    drain = load_config(configmap_file(tmp_path)).shutdown.drain_seconds
    prestop = ROUTER.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    sleep = float(prestop[1]) if prestop[:1] == ["sleep"] else 0.0
    grace = POD["spec"]["terminationGracePeriodSeconds"]
    assert grace >= sleep + drain + ROUTER_EXIT + GRACE_MARGIN


def test_configmap_router_yaml_passes_check_config(tmp_path: Path) -> None:
    res = check_config(configmap_file(tmp_path))
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize(
    "path", sorted((ROOT / "config" / "examples").glob("*.yaml")), ids=lambda p: p.name
)
def test_example_configs_pass_check_config(path: Path) -> None:
    res = check_config(path)
    assert res.returncode == 0, res.stderr


def test_hpa_and_pdb_target_the_router() -> None:
    hpa = one(MANIFESTS, "HorizontalPodAutoscaler").doc["spec"]
    ref = hpa["scaleTargetRef"]
    assert (ref["kind"], ref["name"]) == ("Deployment", DEPLOYMENT.name)
    assert 2 <= hpa["minReplicas"] <= hpa["maxReplicas"]
    resources = {m["resource"]["name"] for m in hpa["metrics"] if m["type"] == "Resource"}
    for name in resources:  # utilization targets are relative to the requests
        assert name in ROUTER["resources"]["requests"]
    pdb = one(MANIFESTS, "PodDisruptionBudget").doc["spec"]
    assert matches(pdb["selector"]["matchLabels"], POD["metadata"]["labels"])
    replicas = DEPLOYMENT.doc["spec"]["replicas"]
    if "maxUnavailable" in pdb:
        assert 1 <= pdb["maxUnavailable"] < replicas
    else:
        assert 1 <= pdb["minAvailable"] < replicas


def test_servicemonitor_scrapes_the_router_metrics() -> None:
    sm = one(MANIFESTS, "ServiceMonitor").doc["spec"]
    assert matches(sm["selector"]["matchLabels"], SERVICE.doc["metadata"]["labels"])
    (endpoint,) = sm["endpoints"]
    assert endpoint["port"] in {p["name"] for p in SERVICE.doc["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"


def test_emulator_services_are_where_the_configmap_points(tmp_path: Path) -> None:
    """Each backend discovers the pods behind a headless Service (one backend per pod)."""
    config = load_config(configmap_file(tmp_path))
    services = {m.name: m.doc for m in MANIFESTS if m.kind == "Service"}
    for backend in config.backends:
        assert backend.discover is not None, "engines are discovered per pod"
        svc = services[backend.discover.dns]
        assert svc["spec"]["clusterIP"] == "None", "headless: the name resolves to each pod"
        assert backend.discover.port in [p["port"] for p in svc["spec"]["ports"]]
        (deployment,) = [
            m.doc
            for m in MANIFESTS
            if m.kind == "Deployment"
            and matches(svc["spec"]["selector"], m.doc["spec"]["template"]["metadata"]["labels"])
        ]
        (emu,) = deployment["spec"]["template"]["spec"]["containers"]
        assert emu["args"][0] == "emulator" and flag(emu["args"], "--profile") == backend.engine
        assert container_port(emu, svc["spec"]["ports"][0]["targetPort"]) == int(
            flag(emu["args"], "--port")
        )


class TestReplayJob:
    JOB = one(MANIFESTS, "Job")
    SPEC = JOB.doc["spec"]
    CONTAINER = SPEC["template"]["spec"]["containers"][0]

    def argv(self, index: int) -> list[str]:
        """The container's argv as Kubernetes expands it for one completion index."""
        env = {"JOB_COMPLETION_INDEX": str(index)}
        return [expand(a, env) for a in [*self.CONTAINER["command"], *self.CONTAINER["args"]]]

    def test_is_an_indexed_job_of_equal_shards(self) -> None:
        assert self.SPEC["completionMode"] == "Indexed"
        n = self.SPEC["completions"]
        assert n >= 2 and self.SPEC["parallelism"] == n, "every shard runs at once"
        assert self.SPEC["template"]["spec"]["restartPolicy"] == "Never"
        raw = [*self.CONTAINER["command"], *self.CONTAINER["args"]]
        assert flag(raw, "--shard") == f"$(JOB_COMPLETION_INDEX)/{n}"
        assert "--no-progress" in raw
        for name in ("--results", "--out"):
            assert "$(JOB_COMPLETION_INDEX)" in flag(raw, name), f"{name} differs per shard"

    def test_targets_the_router_service(self) -> None:
        argv = self.argv(0)
        assert argv[0] == "replay" and argv[0] in SCRIPTS
        target = urlsplit(flag(argv, "--target"))
        assert target.hostname == SERVICE.name
        assert target.port in [p["port"] for p in SERVICE.doc["spec"]["ports"]]

    def test_outputs_land_on_a_mounted_volume(self) -> None:
        mounts = [v["mountPath"] for v in self.CONTAINER["volumeMounts"]]
        argv = self.argv(0)
        for path in (argv[1], flag(argv, "--results"), flag(argv, "--out")):
            assert any(path.startswith(m.rstrip("/") + "/") for m in mounts), path

    def test_volume_and_data_pod_serve_the_job(self) -> None:
        """The claim exists, and the pod used to copy files in and out mounts it at the same
        path and creates the folder the shards write into (the replayer does not)."""
        claims = {
            v["persistentVolumeClaim"]["claimName"]
            for v in self.SPEC["template"]["spec"]["volumes"]
            if "persistentVolumeClaim" in v
        }
        (claim,) = claims
        one(MANIFESTS, "PersistentVolumeClaim", claim)
        pod = one(MANIFESTS, "Pod").doc["spec"]
        (volume,) = [v["name"] for v in pod["volumes"] if v.get("persistentVolumeClaim")]
        (data,) = pod["containers"]
        mount = {m["name"]: m["mountPath"] for m in data["volumeMounts"]}[volume]
        job_mounts = {m["mountPath"] for m in self.CONTAINER["volumeMounts"]}
        assert mount in job_mounts
        out_dir = str(Path(flag(self.argv(0), "--results")).parent)
        assert out_dir == str(Path(flag(self.argv(0), "--out")).parent)
        assert f"mkdir -p {out_dir}" in " ".join(data["command"])

    def test_shards_split_a_capture_exactly(self, tmp_path: Path) -> None:
        """Run the replayer's real CLI with each pod's expanded argv (dry run, the bundled
        demo capture in place of the volume's): the shards' requests add up to the file's."""
        capture = ROOT / "config" / "demo-capture.jsonl"

        def planned(argv: list[str]) -> int:
            cmd = [sys.executable, "-m", "turnout", "replay", *argv, "--dry-run"]
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp_path)
            assert res.returncode == 0, res.stderr
            line = next(ln for ln in res.stdout.splitlines() if ln.startswith("requests"))
            return int(line.split()[1])

        counts = []
        for index in range(self.SPEC["completions"]):
            argv = self.argv(index)[1:]
            argv[0] = str(capture)
            counts.append(planned(argv))
        assert all(counts)
        assert sum(counts) == planned([str(capture)])

    def test_pods_and_the_merge_replay_every_request_once(self, tmp_path: Path) -> None:
        """Every pod's argv (expanded per index, paths and target mapped to this machine) run
        at once against a real router, then the README's merge over the pods' results."""
        capture = tmp_path / "capture.jsonl"
        with (ROOT / "config" / "demo-capture.jsonl").open(encoding="utf-8") as f:
            lines = [json.loads(next(f)) for _ in range(16)]
        for line in lines:  # a short, quick slice of the demo capture
            line["t_offset_ms"] /= 20
            line["body"]["max_tokens"] = 8
        capture.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
        out = tmp_path / "out"
        out.mkdir()
        with (
            start_emulator("vllm", time_scale=50) as vllm,
            start_emulator("deepinfer", time_scale=50) as deepinfer,
        ):
            backends = [("vllm", "vllm", vllm.url), ("deepinfer", "deepinfer", deepinfer.url)]
            path = write_config(tmp_path, base_config(backends))
            with start_router(path) as router:
                procs = []
                for index in range(self.SPEC["completions"]):
                    argv = self.argv(index)[1:]
                    argv[0] = str(capture)
                    argv[argv.index("--target") + 1] = router.url
                    for name in ("--results", "--out"):
                        i = argv.index(name) + 1
                        argv[i] = str(out / Path(argv[i]).name)
                    cmd = [sys.executable, "-m", "turnout", "replay", *argv]
                    procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL))
                try:
                    assert [p.wait(timeout=120) for p in procs] == [0] * len(procs)
                finally:
                    for p in procs:
                        if p.poll() is None:
                            p.kill()
                            p.wait()
        shards = sorted(out.glob("results-*.jsonl"))
        assert len(shards) == self.SPEC["completions"]
        merged = tmp_path / "report.json"
        cmd = [
            sys.executable,
            "-m",
            "turnout",
            "replay",
            "merge",
            *map(str, shards),
            "--out",
            str(merged),
        ]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        (run,) = json.loads(merged.read_text(encoding="utf-8"))["runs"]
        assert (run["overall"]["completed"], run["overall"]["failed"]) == (len(lines), 0)
        ids = [
            json.loads(x)["custom_id"]
            for shard in shards
            for x in shard.read_text(encoding="utf-8").splitlines()
        ]
        assert sorted(ids) == sorted(x["custom_id"] for x in lines)


def test_manifests_are_plain_yaml_documents() -> None:
    """No templating left in the files (they apply as they are)."""
    for path in KUBE.glob("*.yaml"):
        text = path.read_text(encoding="utf-8")
        assert "{{" not in text, path
        list(yaml.safe_load_all(text))
