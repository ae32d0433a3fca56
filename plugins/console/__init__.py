"""Console: the web pages a person signs in to at ``/`` (keys first; docs/console.md).

Pages are rendered on the server from the service's own HTTP API: each page calls the same
routes a client does, in process, with the caller's session cookie (``plugins.console.api``),
so the console holds no tables and reaches no other plugin's state. The live parts (the
wallet sign-in, streams) are small hand-written scripts in ``static/`` that call the API from
the browser. Forms carry a CSRF token; every page sends a CSP with a per-request nonce.
"""
