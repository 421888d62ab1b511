"""What both daemons (``specon-agent``, ``specon-manager``) share.

- ``settings``: the operational settings (how long, how often, how much; never what to decide);
- ``logs``: the structlog set-up (JSON lines, namespaced event names);
- ``cli_args``: command-line pieces (bearer tokens, HOST:PORT and address arguments);
- ``tls``: the ssl contexts of the agent-manager link, handshake failures in words, the
  manager's certificate re-read when it changes;
- ``manager_url``: which manager URLs an agent may send its token to (pure).
"""
