"""The ``specon`` command line: ``main`` dispatches to one ``cmd_*`` module per sub-command.

- ``cmd_classify``, ``cmd_config``, ``cmd_demo``, ``cmd_sim``, ``cmd_learn``, ``cmd_asgd``,
  ``cmd_status``, ``cmd_drain`` (drain and uncordon), ``cmd_trace``, ``cmd_systemd``: the
  sub-commands;
- ``manager_client``: calling the manager from the command line (options, token, errors);
- ``systemd_units``: the systemd units ``specon systemd`` writes, rendered;
- ``reference``: docs/reference.md, generated (``specon config reference``).
"""
