"""The Kubernetes backend: one worker is one node; jobs are pods (the ``kubernetes`` extra).

- ``backend``: ``KubernetesRuntime``;
- ``api``, ``calls``: the client, and the API calls with their retries;
- ``pods``: a job's pod, made and read;
- ``restore``: a restored pod's spec from the saved one;
- ``copying``: the pod a start creates from it, checked;
- ``takeover``: a start that supersedes a lost node's pod deletes it first;
- ``recording``: each managed pod's restore record, written at first sight;
- ``nodes``: nodes as placement candidates;
- ``gpu``: GPU requests, memory and the product a GPU job keeps to;
- ``usage``, ``cgroup``: CPU usage and weights of a node's pods;
- ``others``: what the node's unmanaged pods request, not free to placement;
- ``freezer``: freezing a node's pods and their host PIDs (for NVML);
- ``watch``: the pod and node watches.

Only this subpackage (and the manager's Kubernetes journal and TokenReview) imports
``kubernetes`` (import contract ``kubernetes-backend``).
"""
