"""Training the learned priority rule (``dl2``) in the simulator: ``specon learn``.

``episodes`` runs simulated workloads with the rule's decisions taken by an explorer
(the teacher's, or drawn from the network), ``objectives`` holds the losses and their
gradients, ``train`` the two phases (imitation, then actor-critic with replay).
"""
