"""The ``fetch_url`` agent tool: one web page, as text, for research.

The page is fetched through the core's SSRF guard (``runtime.netguard``, ``runtime.outbound``),
the same one webhook deliveries go through: the host is resolved once, every non-public address
is refused, the connection goes to the checked address, at most 5 redirects are followed, each
checked again, and the body read and the time taken are capped (``fetch_*`` settings). HTML
comes back as its visible text; other text types as they are; anything else is refused.
"""

from __future__ import annotations

import codecs
from email.message import Message
from html.parser import HTMLParser

from plugins.projects.settings import ProjectsSettings
from runtime import outbound
from runtime.agents import JsonObject, Tool, ToolContext, ToolResult
from runtime.netguard import UnsafeUrlError, UrlPolicy

USER_AGENT = "flowsvc-fetch/1"
MAX_REDIRECTS = 5
# What the model gets back: a page's text rarely needs more, and a tool result is stored
# with the run's events.
TEXT_LIMIT = 65536
_TEXT_TYPES = ("application/json", "application/xml", "application/javascript",
               "application/xhtml+xml", "application/rss+xml", "application/atom+xml")
_SKIPPED_ELEMENTS = frozenset({"script", "style", "noscript", "template", "svg", "head"})
_BLOCK_ELEMENTS = frozenset({"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6",
                             "section", "article", "header", "footer", "pre", "table", "ul",
                             "ol", "blockquote", "title"})


class _VisibleText(HTMLParser):
    """The text a reader sees: the title, then the body without scripts and styles."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.title: list[str] = []
        self.parts: list[str] = []
        self._skipping = 0
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        elif tag in _SKIPPED_ELEMENTS:
            self._skipping += 1
        if tag in _BLOCK_ELEMENTS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        elif tag in _SKIPPED_ELEMENTS and self._skipping:
            self._skipping -= 1
        if tag in _BLOCK_ELEMENTS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title.append(data)
        elif not self._skipping:
            self.parts.append(data)

    def text(self) -> str:
        lines = (" ".join(line.split()) for line in "".join(self.parts).splitlines())
        body = "\n".join(line for line in lines if line)
        title = " ".join("".join(self.title).split())
        return f"{title}\n\n{body}" if title else body


def html_text(page: str) -> str:
    """The visible text of an HTML page (title first), one block per line."""
    parser = _VisibleText()
    parser.feed(page)
    parser.close()
    return parser.text()


def _is_text(media_type: str) -> bool:
    return media_type.startswith("text/") or media_type in _TEXT_TYPES \
        or media_type.endswith(("+json", "+xml"))


def page_text(fetched: outbound.Fetched) -> str:
    """The body as text, decoded with its declared charset (UTF-8 when none or unknown).

    :raises outbound.FetchFailed: the body is not text.
    """
    media_type = fetched.content_type.partition(";")[0]
    media_type = media_type.strip().lower()
    if media_type and not _is_text(media_type):
        raise outbound.FetchFailed(f"the page is {media_type}, not text")
    if not media_type and b"\0" in fetched.body:
        raise outbound.FetchFailed("the page is binary, not text")
    header = Message()
    header["content-type"] = fetched.content_type
    charset = header.get_content_charset() or "utf-8"
    try:
        codecs.lookup(charset)
    except LookupError:
        charset = "utf-8"
    text = fetched.body.decode(charset, errors="replace")
    return html_text(text) if media_type in ("text/html", "application/xhtml+xml") else text


def fetch_url_tool(settings: ProjectsSettings) -> Tool:
    """The ``fetch_url`` tool, with the network limits of ``settings``."""
    policy = UrlPolicy.build(allow_http=settings.fetch_allow_http,
                             allowed_hosts=settings.fetch_allowed_hosts,
                             allowed_networks=settings.fetch_allowed_networks,
                             purpose="fetch_url")

    async def fetch_url(context: ToolContext, args: JsonObject) -> ToolResult:
        url = args.get("url") if isinstance(args, dict) else None
        if not isinstance(url, str) or not url:
            return ToolResult(error="argument 'url' is required and must be a string")
        try:
            async with outbound.open_client(max_connections=1, user_agent=USER_AGENT,
                                            timeout=settings.fetch_timeout_seconds) as client:
                fetched = await outbound.fetch(
                    client, url, policy, max_bytes=settings.fetch_max_bytes,
                    timeout=settings.fetch_timeout_seconds, max_redirects=MAX_REDIRECTS)
            text = page_text(fetched)
        except UnsafeUrlError as exc:
            return ToolResult(error=f"url refused: {exc}")
        except outbound.FetchFailed as exc:
            return ToolResult(error=f"fetch failed: {exc}")
        return ToolResult(result={
            "url": fetched.url, "status": fetched.status,
            "contentType": fetched.content_type, "text": text[:TEXT_LIMIT],
            "truncated": fetched.truncated or len(text) > TEXT_LIMIT})

    return Tool("fetch_url",
                "Fetch a public web page (http or https) and return its text; HTML comes back "
                "as its visible text. Private and local addresses are refused.",
                {"type": "object", "additionalProperties": False, "required": ["url"],
                 "properties": {"url": {"type": "string",
                                        "description": "the page's absolute URL"}}},
                fetch_url)
