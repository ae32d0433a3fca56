"""Projects: tokens, projects, agent runs, the live build stream and milestone notifications.

It owns the token registry projects attach to, the projects and their runs, the run queue,
one broadcaster actor per streamed project (a ring of the last events, persisted, fanned
out across processes through Redis Streams), the agent tools and templates it provides
through hooks, and the notifier that tells subscribers about milestones through the
messaging platform's bot. ``docs/projects.md`` documents it.
"""
