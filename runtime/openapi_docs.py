"""``/openapi.json`` and ``/docs``, Swagger UI over it, served by the service itself.

The document is built once, on its first request, in a worker thread: reading every route
takes a second or so of CPU, which would otherwise stall every request of the process.
The viewer's files come from the ``swagger-ui-bundle-v2`` package (Swagger UI 5, which reads
OpenAPI 3.1) and are answered from ``/docs/assets/``: the page needs no network, unlike
quart-schema's own page, which loads Swagger UI from a CDN.
"""

from __future__ import annotations

import json
from pathlib import Path

import trio
from quart import Quart, Response
from quart_schema import hide
from quart_schema.openapi import OpenAPIProvider
from swagger_ui_bundle import swagger_ui_path

from runtime.errors import NotFound

ASSETS = {"swagger-ui-bundle.js": "application/javascript",
          "swagger-ui.css": "text/css",
          "favicon-32x32.png": "image/png"}
_ASSETS_DIR = Path(str(swagger_ui_path))
_PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>{title} API</title>
  <link rel="stylesheet" href="/docs/assets/swagger-ui.css">
  <link rel="icon" type="image/png" href="/docs/assets/favicon-32x32.png">
</head>
<body>
  <div id="swagger-ui" data-openapi="/openapi.json"></div>
  <script src="/docs/assets/swagger-ui-bundle.js"></script>
  <script src="/docs/assets/start.js"></script>
</body>
</html>
"""
# In a file of its own rather than inline, so the page works under a strict
# Content-Security-Policy (script-src 'self').
_START = """window.ui = SwaggerUIBundle({
  url: document.getElementById("swagger-ui").dataset.openapi,
  dom_id: "#swagger-ui",
  deepLinking: true,
  docExpansion: "list",
  tagsSorter: "alpha",
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout"
});
"""


def install_docs(app: Quart, provider: OpenAPIProvider, title: str) -> None:
    """Serve ``provider``'s document at ``/openapi.json``, the page at ``/docs`` and its
    assets at ``/docs/assets/<name>``."""
    document: list[bytes] = []  # the JSON, once built
    building = trio.Lock()

    @app.get("/openapi.json")
    @hide
    async def openapi_document() -> Response:
        async with building:
            if not document:
                document.append(await trio.to_thread.run_sync(
                    lambda: json.dumps(provider.schema()).encode()))
        return Response(document[0], content_type="application/json")

    page = _PAGE.format(title=title)
    # Read once at start (1.7 MB), never from a request: no file I/O on the event loop.
    assets = {name: ((_ASSETS_DIR / name).read_bytes(), content_type)
              for name, content_type in ASSETS.items()}
    assets["start.js"] = (_START.encode(), "application/javascript")

    @app.get("/docs")
    @hide
    async def docs_page() -> Response:
        return Response(page, content_type="text/html; charset=utf-8")

    @app.get("/docs/assets/<name>")
    @hide
    async def docs_asset(name: str) -> Response:
        if name not in assets:
            raise NotFound(f"no docs asset {name!r}")
        body, content_type = assets[name]
        return Response(body, content_type=content_type,
                        headers={"Cache-Control": "public, max-age=86400"})
