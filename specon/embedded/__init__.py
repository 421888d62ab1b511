"""The embedded default: a whole specon cluster on one machine, and the demo that runs on it.

- ``cluster``: a manager process and one agent process per worker, on loopback or each on a
  network host of its own (``network_host``: what the cluster needs of one);
- ``demo``: ``specon demo``, the default scheduler (DS) against specon on the same arrivals;
  ``host_loss``: its ``--lose``, hosts lost mid-run and the work they cost;
- ``live_policies``: the named policies the demo runs live;
- ``docker_hosts``, ``docker_workers``, ``host_image``: workers as private Docker engines on
  this machine, with an image made from this host's own Python (offline).
"""
