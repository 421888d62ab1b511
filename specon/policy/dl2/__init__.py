"""``dl2``: a learned priority policy, after DL2 (Peng et al., "DL2: A Deep Learning-driven
Scheduler for Deep Learning Clusters").

A small network scores each job of a worker from what its agent already knows of it
(``features``); the jobs run in the order of their scores, ranked weights as the other
rules' (``specon.policy.priority.dl2``). The network is plain numpy (``network``), so the
daemons need nothing else; ``specon learn`` trains it in the simulator (``specon.sim.dl2``):
first by imitating the default policy, then by actor-critic reinforcement learning with
exploration and experience replay (``explore`` is how the trainer takes the decisions).
"""
