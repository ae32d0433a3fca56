"""Error codes of the console plugin (documented in docs/console.md)."""

from runtime.errors import Forbidden


class CsrfRefused(Forbidden):
    """Raised (403) when a console form comes without the CSRF token of the browser's cookie."""

    code = "csrf_refused"
