"""Every hook is documented: in ``docs/plugins.md`` and in its own docstring."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import pytest

from runtime import hookspecs
from tests.support.server import ROOT

PLUGINS_DOC = ROOT / "docs" / "plugins.md"
# Return annotations that give nothing back (a hook that only acts, possibly async).
NOTHING = {"None", "Awaitable[None] | None"}


def _hooks() -> dict[str, Callable[..., Any]]:
    """The hook specifications, found by pluggy's marker rather than by name."""
    return {name: fn for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
            if hasattr(fn, "flowsvc_spec")}


HOOKS = _hooks()


def test_the_hooks_are_found() -> None:
    assert {"flowsvc_actors", "flowsvc_blueprints", "flowsvc_tables"} <= set(HOOKS)
    assert set(hookspecs.describe_hooks()) == set(HOOKS)
    assert all(hookspecs.describe_hooks().values())


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_every_hook_is_documented_in_docs_plugins_md(name: str) -> None:
    assert PLUGINS_DOC.exists(), "docs/plugins.md is missing"
    assert re.search(rf"\b{name}\b", PLUGINS_DOC.read_text(encoding="utf-8")), \
        f"{name} is not documented in docs/plugins.md"


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_every_hook_documents_its_params_and_return(name: str) -> None:
    fn = HOOKS[name]
    doc = inspect.getdoc(fn) or ""
    signature = inspect.signature(fn)
    for param in signature.parameters:
        assert f":param {param}:" in doc, f"{name} does not document :param {param}:"
    if str(signature.return_annotation) not in NOTHING:
        assert ":return:" in doc, f"{name} returns {signature.return_annotation} undocumented"


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_async_hooks_say_so_and_none_is_firstresult(name: str) -> None:
    fn = HOOKS[name]
    may_be_async = "Awaitable" in str(inspect.signature(fn).return_annotation)
    assert ("*May be async.*" in (fn.__doc__ or "")) == may_be_async
    # A coroutine is never None: firstresult would stop at the first async implementation.
    assert not fn.flowsvc_spec.get("firstresult")  # type: ignore[attr-defined]
