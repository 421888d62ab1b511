"""The Kubernetes backend: one worker is one node; jobs are pods (the ``kubernetes`` extra).

- ``backend``: ``KubernetesRuntime``;
- ``api``, ``calls``: the client, and the API calls with their retries;
- ``pods``: a job's pod, made and read;
- ``restore``: a restored pod's spec from the saved one;
- ``copying``: the pod a start creates from it, checked;
- ``steering``: the required node affinity that steers a copy to its node through
  kube-scheduler; ``placement``: waiting for the binding, a copy left unplaced withdrawn;
- ``admission``: the admission webhook's answers (a replacement steered, a new pod's
  preferred nodes) as JSON Patches; ``webhook_probe``: whether it answers, asked before a
  Job's pod is evicted; ``adopting``: a start that takes the Job controller's replacement;
- ``takeover``: a start that supersedes a lost node's pod deletes it first;
- ``recording``: each managed pod's restore record, written at first sight;
- ``writes``: every write on a pod or a restore record, checked against the asking node
  (``PodWrites``; ``LocalWriter`` with the process's own identity); ``broker``: the same asked
  of the manager's pod broker (``BrokerWriter``), failures carried across;
- ``node_view``: what the agent reads of its node: its managed pods (a watch per namespace)
  and its node object;
- ``nodes``: nodes as placement candidates; ``selectors``: label selectors;
- ``gpu``: GPU requests, memory and the product a GPU job keeps to;
- ``usage``, ``cgroup``: CPU usage and weights of a node's pods;
- ``others``: what the node's unmanaged pods request, not free to placement (by the agent, or
  for every node at once by the manager: ``ClusterRequests``);
- ``freezer``: freezing a node's pods and their host PIDs (for NVML);
- ``watch``: the pod and node watches;
- ``events``: Kubernetes Events on the pods, what specon did to each.

GPUs (``k8s_gpu``): a pod's ``nvidia.com/gpu`` limits are its GPU request; a GPU job keeps
to its node's ``nvidia.com/gpu.product`` (in its spec's selector, its restore record and so its
copy) unless it allows any. ``freeze``/``thaw`` use the pod's cgroup freezer and ``pids`` its
cgroup's host PIDs (``k8s_freezer``); a save or stop thaws a frozen pod before its SIGTERM.

Deviations from the local runtime, inherent to pods: a saved or stopped pod is deleted, so
it is no longer listed afterwards; ``forget`` deletes an ended pod (and a finished job's
restore record).

Only this subpackage (and the manager's Kubernetes journal and TokenReview) imports
``kubernetes`` (import contract ``kubernetes-backend``).
"""
