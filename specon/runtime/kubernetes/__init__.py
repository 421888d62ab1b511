"""The Kubernetes backend: one worker is one node; jobs are pods (the ``kubernetes`` extra).

- ``backend``: ``KubernetesRuntime``;
- ``api``, ``calls``: the client, and the API calls with their retries;
- ``pods``: a job's pod, made and read;
- ``restore``: a restored pod's spec from the saved one;
- ``nodes``: nodes as placement candidates;
- ``usage``, ``cgroup``: CPU usage and weights of a node's pods;
- ``watch``: the pod watch.

Only this subpackage (and the manager's Kubernetes journal and TokenReview) imports
``kubernetes`` (import contract ``kubernetes-backend``).
"""
