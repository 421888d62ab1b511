"""The Docker-host backend: one worker is one Docker engine (the ``docker`` extra).

- ``backend``: ``DockerRuntime``;
- ``recipe``: how a job's container is made, as plain data;
- ``cgroup``: CPU weights and usage from the containers' cgroups;
- ``criu``: checkpoint/restore of a whole container with CRIU.

Only this subpackage imports ``docker`` (import contract ``docker-backend``).
"""
