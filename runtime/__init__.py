"""The flowsvc core.

Supervisor, actors, plugin manager and hookspecs, config, storage, HTTP app, errors,
CLI. It never imports a plugin.
"""
