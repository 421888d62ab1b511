"""The Docker-host backend: one worker is one Docker engine (the ``docker`` extra).

- ``backend``: ``DockerRuntime`` (its owner records: ``specon.runtime.owners``);
- ``engine``: the engine calls it makes: connecting, images, what a container says about
  itself, a recipe's create arguments;
- ``recipe``: how a job's container is made, as plain data, GPU device requests included;
- ``gpu``: a GPU job's count, memory and product in its spec, for placement;
- ``freezer``: freezing a job (``docker pause``) and its processes' host PIDs (for NVML);
- ``cgroup``: CPU usage and processes from the containers' cgroups;
- ``criu``: checkpoint/restore of a whole container with CRIU (the engine's API);
- ``criu_store``: the jobs' CRIU images on the volume, from a save to the next start;
- ``stale``: a lost host's copy of a job that moved on, killed when its engine lists it;
- ``standby``: standby containers as plain data: their config, which jobs may use one, the
  hand-over request; ``standby_pool``: the agent's standby containers and the hand-over;
  ``standby_server``: a standby container's main process.

Only this subpackage imports ``docker`` (import contract ``docker-backend``).
"""
