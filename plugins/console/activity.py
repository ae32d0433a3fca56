"""The console's usage and requests pages: per-key outcome bars, one key's requests by
outcome or calls by model over time (server-drawn SVG), its usage by model, and the request
log with its live tail (``static/tail.js``; without JavaScript, a refresh link)."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response, request
from quart_schema import hide

from plugins.console.api import call
from plugins.console.security import page
from plugins.console.session import SIGN_IN, see_other, signed_in_user

blueprint = Blueprint("console_activity", __name__, template_folder="templates")
WINDOWS = ("hour", "day", "week", "month")
SINCE = ("day", "week", "month", "all")  # what GET /me/api-keys/<id>/usage takes
OUTCOME_COLOURS = {"ok": "#2b7a3d", "402": "#8a6d00", "429": "#b35c00", "4xx": "#a4161a",
                   "5xx": "#5a189a"}
FILTERS = ("key_id", "status", "route", "request_id")
SERIES_BY = ("outcome", "model")
# Models take these in turn, most calls first.
MODEL_COLOURS = ("#1f4e79", "#2b7a3d", "#8a6d00", "#a4161a", "#5a189a", "#b35c00", "#006d77",
                 "#4a4a4a")


def outcome_bars(stats: list[dict[str, Any]], names: dict[str, str]) -> list[dict[str, Any]]:
    """One stacked bar per key, each segment an outcome, scaled to the busiest key (SVG
    widths in percent)."""
    busiest = max((entry["requests"] for entry in stats), default=0) or 1
    bars = []
    for entry in stats:
        offset = 0.0
        segments = []
        for outcome, count in entry["outcomes"].items():
            width = 100.0 * count / busiest
            if count:
                segments.append({"outcome": outcome, "count": count, "x": offset,
                                 "width": width, "colour": OUTCOME_COLOURS[outcome]})
            offset += width
        bars.append({"key_id": entry["key_id"], "name": names.get(entry["key_id"],
                                                                  entry["key_id"]),
                     "requests": entry["requests"], "segments": segments})
    return bars


def series_columns(buckets: list[dict[str, Any]], by: str, colours: dict[str, str]
                   ) -> list[dict[str, Any]]:
    """One stacked column per bucket (SVG units: 100 high, 10 wide per bucket), each
    segment an outcome or a model (``by``), scaled to the busiest bucket."""
    counted = [{name: figures["calls"] for name, figures in bucket["models"].items()}
               if by == "model" else bucket["outcomes"] for bucket in buckets]
    busiest = max((sum(counts.values()) for counts in counted), default=0) or 1
    columns = []
    for index, (bucket, counts) in enumerate(zip(buckets, counted, strict=True)):
        top = 100.0
        segments = []
        for name, colour in colours.items():
            if counts.get(name):
                height = 100.0 * counts[name] / busiest
                top -= height
                segments.append({"name": name, "count": counts[name], "y": top,
                                 "height": height, "colour": colour})
        columns.append({"x": index * 10, "from": bucket["from"],
                        "total": sum(counts.values()), "segments": segments})
    return columns


@blueprint.get("/console/usage")
@hide
async def usage() -> Response:
    user = await signed_in_user()
    if user is None:
        return see_other(SIGN_IN)
    window = request.args.get("window", "day")
    window = window if window in WINDOWS else "day"
    keys = (await call("GET", "/me/api-keys", query={"limit": "100"})).body.get("keys", [])
    names = {key["id"]: key["name"] for key in keys}
    stats = await call("GET", "/me/api-keys/stats", query={"window": window})
    chosen = request.args.get("key_id") or (keys[0]["id"] if keys else None)
    since = request.args.get("since", "month")
    since = since if since in SINCE else "month"
    by = request.args.get("by", "outcome")
    by = by if by in SERIES_BY else "outcome"
    detail = None
    columns: list[dict[str, Any]] = []
    series_colours = OUTCOME_COLOURS
    if chosen is not None and chosen.isdigit():
        answer = await call("GET", f"/me/api-keys/{chosen}/usage", query={"since": since})
        detail = answer.body.get("usage") if answer.ok else None
        over_time = await call("GET", f"/me/api-keys/{chosen}/series",
                               query={"window": window, "by": by})
        if over_time.ok:
            if by == "model":
                series_colours = {model: MODEL_COLOURS[index % len(MODEL_COLOURS)]
                                  for index, model in enumerate(over_time.body["models"])}
            columns = series_columns(over_time.body["buckets"], by, series_colours)
    return await page("usage.html", user=user, window=window, windows=WINDOWS, since=since,
                      sinces=SINCE, keys=keys, chosen=chosen, detail=detail,
                      bars=outcome_bars(stats.body.get("keys", []), names), columns=columns,
                      chosen_name=names.get(chosen or "", chosen), by=by,
                      series_by=SERIES_BY, series_colours=series_colours,
                      colours=OUTCOME_COLOURS, error=None if stats.ok else stats)


@blueprint.get("/console/requests")
@hide
async def requests_log() -> Response:
    user = await signed_in_user()
    if user is None:
        return see_other(SIGN_IN)
    filters = {name: value for name in FILTERS
               if (value := request.args.get(name, "").strip())}
    keys = (await call("GET", "/me/api-keys", query={"limit": "100"})).body.get("keys", [])
    logged = await call("GET", "/me/api-keys/calls", query={**filters, "limit": "100"})
    return await page("requests.html", user=user, keys=keys, filters=filters,
                      calls=logged.body.get("calls", []), error=None if logged.ok else logged)
