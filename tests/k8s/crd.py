"""The Migration CRD (``manifests/base/crd.yaml``) installed in a test API server, as
``kubectl apply -k manifests/`` installs it, and used once it is Established."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

from specon.runtime.kubernetes.api import KubeApi, KubeError

CRD_FILE = Path(__file__).resolve().parents[2] / "manifests" / "base" / "crd.yaml"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def crd() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(CRD_FILE.read_text())
    return doc


def install_crd(api: KubeApi, *, timeout: float = 30.0) -> None:
    """Create (or replace with the file's) the CRD and wait until the API serves it."""
    body = crd()
    name = body["metadata"]["name"]
    try:
        api.request("POST", CRDS, body=body)
    except KubeError as exc:
        if exc.status != 409:
            raise
        cur = api.request("GET", f"{CRDS}/{name}")
        body["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
        api.request("PUT", f"{CRDS}/{name}", body=body)
    deadline = time.monotonic() + timeout
    while True:
        cur = api.request("GET", f"{CRDS}/{name}")
        conditions = {c["type"]: c["status"] for c in (cur.get("status") or {}).get("conditions") or []}
        if conditions.get("Established") == "True":
            group, version = body["spec"]["group"], body["spec"]["versions"][0]["name"]
            try:  # served (the handler follows Established by a moment)
                api.request("GET", f"/apis/{group}/{version}/{body['spec']['names']['plural']}")
                return
            except KubeError as exc:
                if exc.status != 404:
                    raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"CRD {name} not established: {cur.get('status')}")
        time.sleep(0.1)
