"""Projects: projects attached to tokens, agent runs, the live build stream and milestone
notifications.

A token owner attaches a project to a token of the chain plugin's registry (read through
the ``TOKENS`` contract), starts agent runs that build it in its own git workspace, and
anyone allowed follows the build live over SSE. One job per sub-package:

- ``records/``: project rows and status, access checks, subscribers and their notifier;
- ``engine/``: the run engine (queue, execution, agent loop, model backends, tools,
  templates, workspaces, run rows, publishing a run's events, recording its end);
- ``live/``: the live stream (event log, ring, broadcaster, hub, SSE).

At the root: the glue (``hooks``; ``provided``, which implements the ``AGENT_RUNS`` and
``PROJECTS`` contracts), the HTTP views (``routes``, ``downloads``) and what every part
shares (``settings``, ``tables``, ``errors``). ``docs/projects.md`` documents it.
"""
