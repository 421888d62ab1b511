"""The Docker backend's recorded container config and the host rules it must pass (pure)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specon.runtime.docker.recipe import Bind, HostRules, Recipe, from_inspect, problems, unsafe_host_config

RULES = HostRules(volume="/srv/specon", ro_bind_prefixes=("/usr", "/opt/py"))
OK = Recipe(
    image="train:1", command=("python", "train.py"), binds=(Bind("/usr", "/usr"),), volume_target="/data"
)


def test_a_plain_recipe_passes_and_round_trips() -> None:
    assert problems(OK, RULES) == []
    assert Recipe.from_json(OK.to_json()) == OK


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"binds": (Bind("/etc", "/etc"),)}, "not under a read-only bind prefix"),
        ({"binds": (Bind("/srv/specon", "/x"),)}, "overlaps the shared volume"),
        ({"binds": (Bind("/srv", "/x"),)}, "overlaps the shared volume"),
        ({"binds": (Bind("/usr/../etc", "/x"),)}, "without '..'"),
        ({"binds": (Bind("/usr", "/data/jobs"),)}, "overlaps the volume's place"),
        ({"network_mode": "bridge"}, "allowed: none, host"),
        ({"network_mode": "host"}, "host is not allowed"),
        ({"command": ()}, "command"),
        ({"image": ""}, "image: empty"),
        ({"nano_cpus": 0}, "nano_cpus"),
        ({"volume_target": "data"}, "absolute"),
    ],
)
def test_the_host_refuses_what_it_does_not_allow(change: dict[str, object], why: str) -> None:
    found = problems(replace(OK, **change), RULES)  # type: ignore[arg-type]
    assert any(why in p for p in found), found


def test_allowed_images_and_host_network_are_the_hosts_choice() -> None:
    rules = replace(RULES, images=("other:1",), host_network=True)
    assert problems(replace(OK, network_mode="host"), replace(rules, images=())) == []
    assert any("allowed images" in p for p in problems(OK, rules))


def test_bad_recipe_text_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="bad container recipe"):
        Recipe.from_json('{"image": 3}')
    with pytest.raises(ValueError, match="bad container recipe"):
        Recipe.from_json("not json")


INSPECT = {
    "Config": {
        "Image": "train:1",
        "Entrypoint": ["python"],
        "Cmd": ["train.py", "--epochs", "3"],
        "Env": ["A=1", "SPECON_PROGRESS_FILE=/data/jobs/j/progress.jsonl", "B=x=y"],
        "Labels": {"specon.io/managed": "true", "team": "nlp"},
        "WorkingDir": "/work",
    },
    "HostConfig": {"NanoCpus": 500000000, "NetworkMode": "none", "Init": True},
    "Mounts": [
        {"Type": "bind", "Source": "/srv/specon", "Destination": "/data"},
        {"Type": "bind", "Source": "/opt/py", "Destination": "/opt/py"},
        {"Type": "volume", "Source": "x", "Destination": "/cache"},
    ],
}


def test_a_users_container_becomes_a_recipe_without_its_volume_mount() -> None:
    r = from_inspect(INSPECT, volume="/srv/specon")
    assert r.command == ("python", "train.py", "--epochs", "3")
    assert dict(r.env) == {"A": "1", "B": "x=y"}  # the job contract's SPECON_* are set per start
    assert r.binds == (Bind("/opt/py", "/opt/py"),) and r.volume_target == "/data"
    assert (r.nano_cpus, r.init, r.working_dir) == (500000000, True, "/work")
    assert problems(r, RULES) == []


def test_a_job_directory_mount_places_the_volume_above_it() -> None:
    job_dir = {"Type": "bind", "Source": "/srv/specon/jobs/j", "Destination": "/x/jobs/j"}
    assert from_inspect({**INSPECT, "Mounts": [job_dir]}, volume="/srv/specon").volume_target == "/x"
    attrs = {**INSPECT, "Mounts": [{"Type": "bind", "Source": "/srv", "Destination": "/mnt"}]}
    assert from_inspect(attrs, volume="/srv/specon").volume_target == "/mnt/specon"


def test_privileges_are_named_and_never_recorded() -> None:
    attrs = {"HostConfig": {"Privileged": True, "CapAdd": ["SYS_ADMIN"], "PidMode": "host"}}
    assert unsafe_host_config(attrs) == ["privileged", "cap_add ['SYS_ADMIN']", "pid=host"]
    assert unsafe_host_config(INSPECT) == []
