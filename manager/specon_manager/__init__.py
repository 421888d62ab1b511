"""The specon manager: collects heartbeats, decides migrations and rebalancing, journals them.

An I/O shell around ``specon.coordinator``: no algorithm and no message schema lives here.

- ``__main__``: ``specon-manager``, its arguments and start-up;
- ``shell``: the asynchronous shell that performs the coordinator's effects;
- ``app``: the HTTP face (protocol endpoints, status, /metrics, /healthz);
- ``auth``: bearer tokens and identities; ``auth_kubernetes``: ServiceAccount tokens (TokenReview);
- ``journal``: the write-ahead journal in SQLite; ``k8s_journal``: the same in the Kubernetes API;
- ``status``: the paged status JSON; ``page``: the status page; ``metrics``: Prometheus;
- ``openapi``: the HTTP API as an OpenAPI document; ``heap``: the cluster state kept out of GC.
"""
