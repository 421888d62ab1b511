"""The decision code, pure (no I/O, no clock: snapshots in, decisions out), shared by the
daemons, the simulator and the demo.

- ``monitor``: Algorithm 1, the container monitor (the ``specon`` classifier) and its state;
- ``robust``: the ``robust`` classifier; ``robust_config``: its knobs and their checks;
- ``classifier``: the registry of classifiers and the interface the agent and the simulator use;
- ``placement``: Algorithm 2, target selection; ``rebalance``: Algorithm 3, rebalancing;
- ``scheduler``: one decision pass of the manager; ``decisions``: what the passes decide;
- ``work``: work-aware moves (a move only where it saves more than it costs);
- ``move_costs``: what a move costs, learned from the moves made (the policy's figures as the prior);
- ``remaining``: steps left predicted from the loss curve; ``loss_curve``: Optimus' curve fit;
- ``replay``: a recorded progress log through a classifier (``specon classify``);
- ``quality_point``: a job's quality point estimated from its loss curve (the ``phased`` rule's);
- ``quality_memory``: the cluster's memory of where each model's finished jobs reached quality;
- ``priority/``: priority on the node, one module per rule, and their registry;
- ``dl2/``: the learned rule's features, numpy networks and weights files, and the hook its
  trainer decides through;
- ``gpu_share``: which jobs on one GPU run, freeze, suspend or resume (the priority on a GPU);
- ``plugin``: what a pluggable thing (a priority rule, a classifier) declares about itself;
- ``experiments``: the named experiment policies, one catalogue for ``specon sim`` and
  ``specon demo``.
"""
