"""What both daemons (``specon-agent``, ``specon-manager``) share.

- ``settings``: the operational settings (how long, how often, how much; never what to decide);
- ``logs``: the structlog set-up (JSON lines, namespaced event names);
- ``cli_args``: command-line pieces (bearer tokens, HOST:PORT arguments).
"""
