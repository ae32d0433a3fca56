"""The live stream: any stream of committed run events, replayed and followed over SSE.

It owns the durable event log and its Redis mirror (``event_log``), the ring of a
stream's newest events and the readers' cursors into it (``ring``), the broadcaster actor
of one stream (``broadcaster``), the hub actor that starts broadcasters and tails Redis
for events of other processes (``hub``), the ``text/event-stream`` response (``sse``) and
the budget of bytes queued to readers (``queued``). It knows streams, not projects or
runs: it depends on nothing else in the plugin but its tables, settings and error codes.
"""
