"""GPUs in a Docker job's recipe: the engine's DeviceRequests in normal form, the host rule that
allows them, the request body docker-py sends, and the spec placement reads (pure, no engine)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import docker
import pytest

from specon.model import (
    GPU_ANY_PRODUCT_LABEL,
    GPU_MEMORY_NEED_LABEL,
    GPU_PRODUCT_LABEL,
    ContainerId,
    Resources,
    WorkerId,
)
from specon.runtime.base import JobSpec
from specon.runtime.docker.engine import create_kwargs
from specon.runtime.docker.gpu import gpu_memory, with_gpu_needs
from specon.runtime.docker.recipe import (
    DeviceRequest,
    HostRules,
    Recipe,
    from_inspect,
    gpu_request,
    gpu_requests,
    problems,
    unsafe_host_config,
)

RULES = HostRules(volume="/srv/specon", gpus=2)
BASE = Recipe(image="train:1", command=("python", "train.py"), volume_target="/data")
GPU1 = replace(BASE, device_requests=(gpu_request(1),))
H100 = "NVIDIA-H100-80GB-HBM3"


def cli(count: int = 0, ids: list[str] | None = None, caps: Any = None, driver: str = "") -> dict[str, Any]:
    """An entry as ``docker run --gpus`` writes it (docker CLI: no driver, capability gpu)."""
    return {
        "Driver": driver,
        "Count": count,
        "DeviceIDs": ids,
        "Capabilities": [["gpu"]] if caps is None else caps,
        "Options": {},
    }


# -- from the engine's format to the recipe's normal form ---------------------------------------
@pytest.mark.parametrize(
    ("raw", "count"),
    [
        ([cli(2)], 2),  # --gpus 2
        ([cli(ids=["0", "3"])], 2),  # --gpus '"device=0,3"': the ids name this host's GPUs
        ([cli(ids=["GPU-fef8089b-4820-abfc-e83e-94318197576e"])], 1),
        ([cli(1, driver="nvidia")], 1),  # docker-py's DeviceRequest(driver="nvidia", count=1)
        ([cli(1), cli(ids=["2"])], 2),  # several requests merge into one
        ([cli(-1)], 2),  # --gpus all: as many as this host allows a job
    ],
)
def test_gpu_requests_become_one_normal_form_request(raw: list[dict[str, Any]], count: int) -> None:
    (req,) = gpu_requests(raw, all_gpus=2)
    assert req == DeviceRequest(driver="nvidia", count=count, device_ids=(), capabilities=(("gpu",),))
    assert problems(replace(BASE, device_requests=(req,)), RULES) == []


def test_all_gpus_where_the_host_allows_none_stays_all_and_is_refused() -> None:
    (req,) = gpu_requests([cli(-1)])
    assert req.count == -1
    recipe = replace(BASE, device_requests=(req,))
    assert recipe.gpus == 0
    assert any("Count -1 (all GPUs)" in p for p in problems(recipe, RULES))


def test_from_inspect_records_the_request_and_no_device_ids() -> None:
    attrs = {
        "Config": {"Image": "train:1", "Cmd": ["python", "train.py"]},
        "HostConfig": {"DeviceRequests": [cli(ids=["0"])]},
    }
    r = from_inspect(attrs, volume="/srv/specon")
    assert r.device_requests == (gpu_request(1),) and r.gpus == 1
    assert "DeviceIDs" in r.to_json() and '"0"' not in r.to_json()
    assert Recipe.from_json(r.to_json()) == r
    assert from_inspect({"Config": {}, "HostConfig": {"DeviceRequests": None}}, volume="/v").gpus == 0


def test_the_recipe_carries_the_engines_keys() -> None:
    data = json.loads(GPU1.to_json())
    assert data["device_requests"] == [
        {"Driver": "nvidia", "Count": 1, "DeviceIDs": [], "Capabilities": [["gpu"]]}
    ]


# -- the host rule ----------------------------------------------------------------------------------
def test_a_host_allows_gpus_only_by_its_own_rule() -> None:
    assert problems(BASE, HostRules(volume="/srv/specon")) == []  # no GPU: as before
    refused = problems(GPU1, HostRules(volume="/srv/specon"))
    assert refused == ["GPUs: the job requests 1; this host allows none (agent flag --docker-allow-gpus)"]
    assert problems(GPU1, RULES) == []
    three = replace(BASE, device_requests=(gpu_request(3),))
    assert problems(three, RULES) == ["GPUs: the job requests 3; this host allows at most 2 per job"]
    with pytest.raises(ValueError, match="gpus must be >= 0"):
        HostRules(volume="/v", gpus=-1)


@pytest.mark.parametrize(
    ("req", "why"),
    [
        (DeviceRequest("cdi", 1, (), (("gpu",),)), "driver 'cdi'"),
        (DeviceRequest("", 1, (), (("gpu",),)), "driver ''"),
        (DeviceRequest("nvidia", 1, (), (("gpu", "utility"),)), "NVIDIA_DRIVER_CAPABILITIES"),
        (DeviceRequest("nvidia", 1, (), ()), "only [['gpu']]"),
        (DeviceRequest("nvidia", 0, ("0",), (("gpu",),)), "name another host's GPUs"),
        (DeviceRequest("nvidia", 0, (), (("gpu",),)), "Count must be >= 1"),
        (DeviceRequest("nvidia", -3, (), (("gpu",),)), "Count must be >= 1"),
    ],
)
def test_a_request_not_in_normal_form_is_refused_whoever_wrote_it(req: DeviceRequest, why: str) -> None:
    found = problems(replace(BASE, device_requests=(req,)), RULES)
    assert any(why in p for p in found), found


def test_a_recipe_from_the_volume_with_a_bad_request_is_a_clear_error() -> None:
    text = json.dumps({"image": "x", "command": ["y"], "device_requests": [{"Count": "two"}]})
    with pytest.raises(ValueError, match=r"bad container recipe.*device_requests\[0\]"):
        Recipe.from_json(text)
    # Recipes written before device requests (a bare count, never used) still read.
    old = json.dumps({"image": "x", "command": ["y"], "gpus": 1})
    assert Recipe.from_json(old).device_requests == ()


def test_devices_no_recipe_can_carry_are_named_and_never_adopted() -> None:
    cdi = {"Driver": "cdi", "DeviceIDs": ["vendor.com/class=x"], "Capabilities": None}
    assert unsafe_host_config({"HostConfig": {"DeviceRequests": [cdi]}}) == [
        "device request 'cdi' (only NVIDIA GPU requests are carried)"
    ]
    with_options = {**cli(1, driver="nvidia"), "Options": {"x": "y"}}
    assert len(unsafe_host_config({"HostConfig": {"DeviceRequests": [with_options]}})) == 1
    assert unsafe_host_config({"HostConfig": {"Runtime": "nvidia"}})[0].startswith("runtime nvidia")
    assert unsafe_host_config({"HostConfig": {"DeviceRequests": [cli(1), cli(ids=["1"])]}}) == []
    # Kept as they are, so that ``problems`` says why wherever the recipe goes.
    (kept,) = gpu_requests([cdi])
    assert kept.driver == "cdi" and problems(replace(BASE, device_requests=(kept,)), RULES)


# -- the engine's request body ------------------------------------------------------------------------
class _SentError(Exception):
    pass


def create_body(kwargs: dict[str, Any], version: str = "1.43") -> dict[str, Any]:
    """The JSON body docker-py sends to ``POST /containers/create`` for ``kwargs``."""
    client = docker.DockerClient(base_url="unix:///nonexistent/docker.sock", version=version)
    sent: dict[str, Any] = {}

    def capture(url: str, **kw: Any) -> None:
        sent.update(url=url, body=json.loads(kw["data"]))
        raise _SentError

    client.api._post = capture
    with pytest.raises(_SentError):
        client.containers.create(**kwargs)
    assert sent["url"].endswith("/containers/create")
    body: dict[str, Any] = sent["body"]
    return body


def kwargs_of(recipe: Recipe) -> dict[str, Any]:
    spec = JobSpec(id=ContainerId("g-1"), command=recipe.command, template=recipe.to_json())
    return create_kwargs(
        spec, recipe, run_id="0123456789abcdef", worker=WorkerId("gpu-box-1"), job_dir=Path("/srv/j/g-1")
    )


def test_create_sends_the_engines_device_request_exactly() -> None:
    body = create_body(kwargs_of(replace(BASE, device_requests=(gpu_request(2),))))
    assert body["HostConfig"]["DeviceRequests"] == [
        {"Driver": "nvidia", "Count": 2, "DeviceIDs": [], "Capabilities": [["gpu"]], "Options": {}}
    ]
    assert "DeviceRequests" not in create_body(kwargs_of(BASE))["HostConfig"]


def test_engines_before_api_1_40_cannot_take_device_requests() -> None:
    with pytest.raises(docker.errors.InvalidVersion, match="device_requests"):
        create_body(kwargs_of(GPU1), version="1.39")


# -- the spec placement reads -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("17179869184", 16 * 2**30),
        ("16Gi", 16 * 2**30),
        ("81920Mi", 80 * 2**30),
        ("40G", 40 * 10**9),
        ("1.5Gi", 3 * 2**29),
        (" 512k ", 512_000),
        ("0", 0),
    ],
)
def test_gpu_memory_takes_bytes_or_a_quantity(raw: str, expected: int) -> None:
    assert gpu_memory(raw) == expected


@pytest.mark.parametrize("raw", ["16GB", "-1", "", "lots", "16 Gi", "2Pi", "1e9", "9999999Ti"])
def test_a_bad_gpu_memory_is_a_clear_error(raw: str) -> None:
    with pytest.raises(ValueError, match=GPU_MEMORY_NEED_LABEL):
        gpu_memory(raw)


def spec_of(recipe: Recipe, **changes: Any) -> JobSpec:
    spec = JobSpec(id=ContainerId("g-1"), command=recipe.command, template=recipe.to_json())
    return replace(spec, **changes)


def test_a_gpu_job_keeps_to_the_product_it_first_ran_on() -> None:
    recipe = replace(GPU1, labels=((GPU_MEMORY_NEED_LABEL, "16Gi"), ("team", "nlp")))
    spec = with_gpu_needs(spec_of(recipe, requests=Resources(cpu=2)), recipe, product="NVIDIA H100 80GB HBM3")
    assert spec.requests == Resources(cpu=2, gpu=1)
    assert spec.gpu_memory == 16 * 2**30
    assert spec.selector == ((GPU_PRODUCT_LABEL, H100),)
    # Where it goes next, its spec already names the product: the target's own is not taken.
    assert with_gpu_needs(spec, recipe, product="NVIDIA A100-SXM4-40GB") == spec


def test_the_jobs_own_labels_decide_product_and_memory() -> None:
    recipe = replace(GPU1, labels=((GPU_PRODUCT_LABEL, "NVIDIA-A100-SXM4-40GB"),))
    spec = spec_of(recipe, selector=(("zone", "a"),), labels=((GPU_MEMORY_NEED_LABEL, "1Gi"),))
    out = with_gpu_needs(spec, recipe, product=H100)
    assert out.selector == (("zone", "a"), (GPU_PRODUCT_LABEL, "NVIDIA-A100-SXM4-40GB"))
    assert out.gpu_memory == 2**30  # the spec's label wins over the container's


def test_a_job_that_allows_any_product_gets_no_product_pair() -> None:
    recipe = replace(GPU1, labels=((GPU_ANY_PRODUCT_LABEL, "true"),))
    out = with_gpu_needs(spec_of(recipe), recipe, product=H100)
    assert out.selector == () and out.requests.gpu == 1


def test_a_cpu_job_is_left_as_it_was_and_a_bad_label_is_an_error() -> None:
    spec = spec_of(BASE, labels=((GPU_MEMORY_NEED_LABEL, "lots"),))
    assert with_gpu_needs(spec, BASE, product=H100) is spec
    gpu = replace(GPU1, labels=((GPU_MEMORY_NEED_LABEL, "lots"),))
    with pytest.raises(ValueError, match="is not a byte count"):
        with_gpu_needs(spec_of(gpu), gpu, product=None)
    # No product known here (no NVML, no engine label): no pair, the job may go to any product.
    assert with_gpu_needs(spec_of(GPU1), GPU1, product=None).selector == ()
