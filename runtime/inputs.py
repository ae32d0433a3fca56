"""What flowsvc accepts from a client before any plugin sees it: JSON bodies, text, ids.

Every JSON body is read by ``parse_json_body`` (through ``FlowsvcRequest.get_json``, which
quart-schema's ``validate_request`` calls): UTF-8 only, no byte order mark, no ``NaN`` or
``Infinity``, at most ``MAX_DEPTH`` levels of nesting and no NUL character in any string
(PostgreSQL cannot store one). Anything else is a 400 ``invalid_request`` naming what is
wrong, never a 500; a body sent with another ``Content-Type`` is a 415. Every body model
derives from ``Body``: strict types (a JSON boolean is a boolean, an integer an integer) and
no unknown field. Text fields that people read (names, titles) use ``Label`` or ``Text``;
times ``Time``. Integer path ids use the ``int`` converter: ASCII digits bounded to a signed
64-bit integer, so an id that cannot exist is a 404 instead of an overflow in the database
or another id read from other digits (``int()`` also reads "١٢" as 12).
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable
from decimal import Decimal
from typing import Annotated, Any

from pydantic import AfterValidator, AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Strict
from quart_trio.wrappers.request import TrioRequest
from werkzeug.exceptions import NotFound
from werkzeug.routing import IntegerConverter

from runtime.errors import InvalidRequest, UnsupportedMediaType

MAX_DEPTH = 64
MAX_ID = 2**63 - 1
_BOMS = (b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff")
# Bidirectional embeddings, overrides and isolates: they make text read differently from
# what it is (CVE-2021-42574, "Trojan Source").
_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
# Letters and symbols that render as blank space (Hangul fillers, the blank braille cell).
_BLANK_GLYPHS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def _refuse_constant(name: str) -> Any:
    raise InvalidRequest(f"the request body contains {name}, which is not JSON",
                         details=[{"field": "body", "message": f"{name} is not JSON"}])


def parse_json_body(raw: bytes, *, parse_float: Callable[[str], Any] | None = None) -> Any:
    """The JSON value of a request body.

    :param parse_float: how to read numbers with a fraction (``Decimal`` for exact amounts).
    :raises InvalidRequest: the body is not UTF-8 JSON within the limits above.
    """
    if raw.startswith(_BOMS) or (len(raw) >= 2 and (raw[0] == 0 or raw[1] == 0)):
        raise _invalid("the request body must be JSON in UTF-8, without a byte order mark")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _invalid("the request body is not valid UTF-8") from None
    try:
        value = json.loads(text, parse_float=parse_float, parse_constant=_refuse_constant)
    except RecursionError:
        raise _invalid(f"the request body is nested more than {MAX_DEPTH} levels deep") from None
    except ValueError:
        raise _invalid("the request body is not valid JSON") from None
    _check_tree(value)
    return value


def _check_tree(value: Any) -> None:
    """Refuse nesting deeper than ``MAX_DEPTH`` and NUL characters (without recursion)."""
    stack: list[tuple[Any, str, int]] = [(value, "body", 1)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise _invalid(f"{where} contains a NUL character", field=where)
        elif isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                raise _invalid(f"the request body is nested more than {MAX_DEPTH} levels deep")
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in pairs:
                if isinstance(key, str) and "\x00" in key:
                    raise _invalid(f"a key of {where} contains a NUL character", field=where)
                stack.append((child, str(key) if where == "body" else f"{where}.{key}",
                              depth + 1))


def _invalid(message: str, *, field: str = "body") -> InvalidRequest:
    return InvalidRequest(message, details=[{"field": field, "message": message}])


class FlowsvcRequest(TrioRequest):
    """Quart-trio's request, reading JSON bodies with ``parse_json_body``."""

    async def get_json(self, force: bool = False, silent: bool = False,
                       cache: bool = True) -> Any:
        if cache and self._cached_json[silent] is not Ellipsis:
            return self._cached_json[silent]
        if not (force or self.is_json):
            if silent or not await self.get_data(cache=True, as_text=False,
                                                 parse_form_data=False):
                return None  # no body: the route's validation names what is missing
            raise UnsupportedMediaType(
                f"the request body must be application/json, not {self.mimetype or 'untyped'}")
        raw = await self.get_data(cache=cache, as_text=False, parse_form_data=False)
        try:
            result = parse_json_body(raw)
        except InvalidRequest:
            if not silent:
                raise
            result = None
        if cache:
            self._cached_json[silent] = result
        return result

    async def exact_json(self) -> Any:
        """The body parsed with fractions as ``Decimal`` (amounts with no float rounding)."""
        raw = await self.get_data(cache=True, as_text=False, parse_form_data=False)
        return parse_json_body(raw, parse_float=Decimal)


class Body(BaseModel):
    """Base of every request body model: a field the model does not name is refused with a
    400 naming it (``details: [{field, message: "Extra inputs are not permitted"}]``),
    so a misspelt optional field never passes silently; and every field is strict: a
    boolean takes only ``true``/``false`` (not ``0`` or ``"yes"``), an integer only a JSON
    integer (not ``true``, ``1.0`` or ``"1"``), a string only a string. A number field
    takes integers and fractions. tests/runtime/test_inputs.py walks every body model of
    every plugin and fails on a lax one."""

    model_config = ConfigDict(extra="forbid", strict=True)


def _time_string(value: object) -> object:
    if not isinstance(value, str):
        raise ValueError("must be an ISO 8601 time string with its offset")
    return value


Time = Annotated[AwareDatetime, Strict(False), BeforeValidator(_time_string)]
"""A time in a body: an ISO 8601 string with an offset, nothing else. (Strict validation
of a parsed JSON body would take only ``datetime`` objects, and lax validation also reads
numbers as Unix times.)"""


class BoundedIntegerConverter(IntegerConverter):
    """``<int:id>`` for ids: ASCII digits only, and a number above 2^63 - 1 cannot exist;
    either way the path is a 404.

    Raised from here rather than by declining the match (werkzeug's ``max``), which would
    answer 405 when another method's rule matches the same path.
    """

    def to_python(self, value: str) -> int:
        # The rule's \d+ also matches the digits of every script, which int() reads.
        if not value.isascii():
            raise NotFound()  # rendered as the service's 404 by runtime.http
        number = int(value)
        if number > MAX_ID:
            raise NotFound()
        return number


def check_visible(value: str, *, multiline: bool = False) -> str:
    """``value`` if people can read it as it is.

    :raises ValueError: it has no visible character (only spaces, zero-width or control
        characters), carries bidirectional overrides, or control characters (line breaks
        and tabs only where ``multiline``).
    """
    allowed = "\n\r\t" if multiline else ""
    if any(char in _BIDI_CONTROLS for char in value):
        raise ValueError("must not contain bidirectional override or isolate characters")
    if any(unicodedata.category(char) == "Cc" and char not in allowed for char in value):
        raise ValueError("must not contain control characters")
    if not any(unicodedata.category(char)[0] in "LNPS" and char not in _BLANK_GLYPHS
               for char in value):
        raise ValueError("must contain a visible character")
    return value


Label = Annotated[str, AfterValidator(check_visible)]
"""A one-line text people read (a name, a title): see ``check_visible``."""

Text = Annotated[str, AfterValidator(lambda value: check_visible(value, multiline=True))]
"""A text people read that may span lines (a description, a brief)."""
