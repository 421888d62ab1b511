"""specon: speculative container scheduling for deep-learning training clusters.

The core package: progress reading, the three SpeCon algorithms as pure decision
code, the policy file, the wire protocol and the command-line interface. The
daemons (``agent``, ``manager``) and the simulator import it; it imports neither.
"""

__version__ = "0.1.0"
