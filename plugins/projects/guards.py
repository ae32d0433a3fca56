"""A guard for views: check the caller before anything else (body validation included)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

View = TypeVar("View", bound=Callable[..., Awaitable[Any]])


def caller_first(check: Callable[[], object]) -> Callable[[View], View]:
    """Run ``check`` (``require_user``, ``require_internal``) before the view and before
    its body is validated: a caller without credentials learns that first (401), not
    what is wrong with a body it may not send anyway."""

    def decorate(view: View) -> View:
        @functools.wraps(view)
        async def checked(*args: Any, **kwargs: Any) -> Any:
            check()
            return await view(*args, **kwargs)

        return checked  # type: ignore[return-value]

    return decorate
