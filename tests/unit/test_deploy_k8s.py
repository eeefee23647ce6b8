"""deploy/k8s/: the Kubernetes objects validate against the Kubernetes schemas
(kubernetes-validate, strict, when installed); KEDA's objects against the fields of its
CRDs (structural: no KEDA schema package on PyPI); and the pieces fit together (the
ScaledObject reads the planner's endpoint for a pool of pools.json, whose bridges the
Deployment names)."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from aigcq.config import load_pools

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
KEDA = "keda.sh/v1alpha1"

#: the fields of KEDA's ScaledObject / TriggerAuthentication specs the example may use
SCALED_OBJECT_SPEC = {
    "scaleTargetRef", "pollingInterval", "cooldownPeriod", "idleReplicaCount",
    "initialCooldownPeriod", "minReplicaCount", "maxReplicaCount", "advanced", "triggers",
    "fallback",
}  # fmt: skip
TRIGGER = {"type", "name", "metadata", "authenticationRef", "metricType", "useCachedMetrics"}
METRICS_API = {
    "url", "valueLocation", "targetValue", "activationTargetValue", "authMode", "format",
    "unsafeSsl",
}  # fmt: skip
TRIGGER_AUTH_SPEC = {
    "secretTargetRef",
    "env",
    "podIdentity",
    "hashiCorpVault",
    "configMapTargetRef",
}


def objects() -> list[dict[str, Any]]:
    found = []
    for path in sorted(K8S.glob("*.yaml")):
        found += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return found


def of(kind: str) -> list[dict[str, Any]]:
    return [o for o in objects() if o["kind"] == kind]


def test_kubernetes_objects_validate_against_the_schemas() -> None:
    validate = pytest.importorskip("kubernetes_validate")
    core = [o for o in objects() if o["apiVersion"] != KEDA]
    assert {o["kind"] for o in core} >= {"Deployment", "StatefulSet", "Service", "ConfigMap"}
    for obj in core:
        validate.validate(obj, "1.37.0", strict=True)


def test_keda_objects_have_the_crd_fields() -> None:
    (scaled,) = of("ScaledObject")
    (auth,) = of("TriggerAuthentication")
    assert scaled["apiVersion"] == auth["apiVersion"] == KEDA
    spec = scaled["spec"]
    assert set(spec) <= SCALED_OBJECT_SPEC and {"scaleTargetRef", "triggers"} <= set(spec)
    assert isinstance(spec["scaleTargetRef"]["name"], str)
    for key in ("pollingInterval", "cooldownPeriod", "minReplicaCount", "maxReplicaCount"):
        assert isinstance(spec[key], int)
    (trigger,) = spec["triggers"]
    assert set(trigger) <= TRIGGER and trigger["type"] == "metrics-api"
    assert trigger["metricType"] in ("AverageValue", "Value", "Utilization")
    meta = trigger["metadata"]
    assert set(meta) <= METRICS_API and all(isinstance(v, str) for v in meta.values())
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    assert set(auth["spec"]) <= TRIGGER_AUTH_SPEC
    (ref,) = auth["spec"]["secretTargetRef"]
    assert set(ref) == {"parameter", "name", "key"} and ref["parameter"] == "token"


def test_the_pieces_fit(tmp_path: Path) -> None:
    (scaled,) = of("ScaledObject")
    spec, (trigger,) = of("ScaledObject")[0]["spec"], scaled["spec"]["triggers"]
    url = urlsplit(trigger["metadata"]["url"])
    assert url.path == "/api/capacity/keda" and trigger["metadata"]["valueLocation"] == "desired"
    pool = parse_qs(url.query)["pool"][0]
    config = next(c for c in of("ConfigMap") if c["metadata"]["name"] == "aigcq-config")
    (tmp_path / "pools.json").write_text(config["data"]["pools.json"])
    json.loads(config["data"]["model.json"])
    pools = load_pools(tmp_path)
    assert spec["maxReplicaCount"] == pools[pool].max
    assert spec["minReplicaCount"] == pools[pool].min
    target = next(
        d for d in of("Deployment") if d["metadata"]["name"] == spec["scaleTargetRef"]["name"]
    )
    init = target["spec"]["template"]["spec"]["initContainers"][0]["command"][-1]
    bridge_id = init.split()[1].replace("$(POD_NAME)", "rent-7d9f-abcde")
    assert fnmatch.fnmatchcase(bridge_id, pools[pool].bridges)
    (serve,) = [d for d in of("Deployment") if d["metadata"]["name"] == "aigcq-serve"]
    assert serve["spec"]["replicas"] == 2
    env = {
        e["name"]: e.get("value") for e in serve["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["AIGCQ_REDIS_SENTINELS"] == "sentinel:26379" and env["AIGCQ_REDIS_MASTER"]
