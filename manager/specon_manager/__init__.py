"""The specon manager: collects heartbeats, decides migrations and rebalancing, journals them.

An I/O shell around ``specon.coordinator``: no algorithm and no message schema lives here.

- ``__main__``: ``specon-manager``, its arguments and start-up;
- ``shell``: the asynchronous shell that performs the coordinator's effects;
- ``app``: the HTTP face (protocol endpoints, status, /metrics, /healthz);
- ``fronts``: past one core (``--fronts N``), the decider's side: its sockets and the front
  processes it keeps; ``front``: one front (TLS, HTTP, tokens, decoding and checks of
  heartbeats); ``relay``: the frames between them;
- ``auth``: bearer tokens and identities; ``auth_kubernetes``: ServiceAccount tokens (TokenReview);
- ``pod_broker``: the pod writes Kubernetes agents ask for, made if the manager decided them;
  ``k8s_events``: the Events it records on a job's pod when a move ends; ``admission``: the
  pod admission webhook (where a new or replacement pod should be scheduled);
- ``journal``: the write-ahead journal in SQLite; ``k8s_crd_journal``: the same in the Kubernetes
  API (``Migration`` resources); ``k8s_journal``: its ConfigMap plumbing and the ConfigMap journal
  before it, which ``k8s_journal_upgrade`` carries over;
- ``leader``: leader election between replicas (a Lease), the journal fenced by it; ``lease``: its
  decisions; ``leader_pod``: the leader's label on its own pod, which the HA Service selects;
  ``standby``: /readyz and what a standby answers;
- ``status``: the paged status JSON; ``page``: the status page (and its login form), with
  ``page_workers`` (each worker's load and jobs) and ``page_jobs`` (each job's loss curve,
  progress, history and moves); ``metrics``: Prometheus; ``cost_metrics``: the learned move costs;
- ``login``: the status page in a browser (log in and out, the session cookie); ``sessions``: its sessions;
- ``openapi``: the HTTP API as an OpenAPI document, its schemas walked by ``openapi_schemas``;
  ``heap``: the cluster state kept out of GC.
"""
