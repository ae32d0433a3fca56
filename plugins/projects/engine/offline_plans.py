"""The offline plans of the four built-in templates: real files derived from the brief.

An offline plan turns the project's brief into real files, written and committed
through the same tools a model would call (the ``offline`` backend plays it). The files
are derived from the brief alone and say so where it matters (a research report drafted
offline consulted no sources).
"""

from __future__ import annotations

import html
import json
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

from runtime.agents import PlannedCall, PlannedStep

_STOPWORDS = frozenset(
    "about after also and any are build built can each for from have into its let lets more "
    "must our over should some such than that the their them then there these they this "
    "those through using want what when where which while who will with would your".split()
)

# "Build a pizza site for Luigi's" names the project "Pizza site for Luigi's".
_LEADING_REQUEST = re.compile(
    r"^(?:please\s+)?(?:build|create|make|write|design|develop|research|study|plan)\s+"
    r"(?:(?:me|us)\s+)?(?:(?:a|an|the)\s+)?", re.IGNORECASE)


def _sentences(brief: str) -> list[str]:
    parts = re.split(r"(?<=[.!?])\s+", " ".join(brief.split()))
    return [part for part in parts if part] or ["A project without a brief."]


def _headline(brief: str, project: Mapping[str, Any]) -> str:
    title = project.get("title")
    if isinstance(title, str) and title.strip():
        return title.strip()
    first = _LEADING_REQUEST.sub("", _sentences(brief)[0]).rstrip(".!?") or "Untitled project"
    first = first[0].upper() + first[1:]
    return first if len(first) <= 60 else first[:57].rsplit(" ", 1)[0] + "..."


def _keywords(brief: str, count: int) -> list[str]:
    words = [word.lower() for word in re.findall(r"[A-Za-z][A-Za-z0-9-]{3,}", brief)]
    ranked = Counter(word for word in words if word not in _STOPWORDS)
    return [word for word, _ in ranked.most_common(count)]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "item"


def _write(path: str, content: str) -> PlannedCall:
    return PlannedCall("write_file", {"path": path, "content": content})


def _commit(message: str) -> PlannedCall:
    return PlannedCall("git_commit", {"message": message})


def _fill(source: str, **literals: object) -> str:
    """Put Python literals (as JSON) into the ``__NAME__`` slots of a source file, in one pass."""
    return re.sub(r"__([A-Z]+)__", lambda slot: json.dumps(literals[slot.group(1)], indent=4),
                  source)


def _bullets(items: list[str]) -> str:
    return "\n".join(f"- {item}" for item in items)


# ---------------------------------------------------------------- fullstack-builder

_APP_JS = """// Shows whether the API server (server.py) answers, and lists the features it serves.
async function refreshStatus() {
  const status = document.getElementById("status");
  try {
    const reply = await fetch("/api/health");
    const body = await reply.json();
    status.textContent = body.ok ? "API online" : "API unhealthy";
  } catch (error) {
    status.textContent = "API offline: open the page through server.py";
  }
}

document.addEventListener("DOMContentLoaded", refreshStatus);
"""

_SERVER_PY = '''"""Serves the page and a tiny JSON API: python server.py [port]."""

import json
import sys
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

FEATURES = __FEATURES__


class Handler(SimpleHTTPRequestHandler):
    def do_GET(self):
        routes = {"/api/health": {"ok": True}, "/api/features": {"features": FEATURES}}
        if self.path not in routes:
            return super().do_GET()
        body = json.dumps(routes[self.path]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8080
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


_CHECK_PY = '''"""The build's own check (python check.py): the server and its page answer."""

import json
import subprocess
import sys
import time
import urllib.request

PORT = 8765
# Straight to the loopback, whatever proxy the environment names.
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
server = subprocess.Popen([sys.executable, "server.py", str(PORT)])
try:
    for _ in range(100):
        try:
            health = json.load(opener.open(f"http://127.0.0.1:{PORT}/api/health"))
            break
        except OSError:
            time.sleep(0.1)
    else:
        sys.exit("server.py did not answer within 10 seconds")
    assert health == {"ok": True}, health
    page = opener.open(f"http://127.0.0.1:{PORT}/").read().decode()
    assert "<h1>" in page and "app.js" in page, "the page is not served"
    print("check passed: /api/health answers and the page is served")
finally:
    server.kill()
'''


def fullstack_plan(brief: str, project: Mapping[str, Any]) -> list[PlannedStep]:
    headline = _headline(brief, project)
    # The first sentence usually names the project; the rest describe what it does.
    features = _sentences(brief)[1:] or _sentences(brief)
    items = "\n".join(f"      <li>{html.escape(feature)}</li>" for feature in features)
    page = (
        '<!doctype html>\n<html lang="en">\n<head>\n  <meta charset="utf-8">\n'
        f"  <title>{html.escape(headline)}</title>\n</head>\n<body>\n  <main>\n"
        f"    <h1>{html.escape(headline)}</h1>\n    <p>{html.escape(brief.strip())}</p>\n"
        f"    <h2>Features</h2>\n    <ul>\n{items}\n    </ul>\n"
        '    <h2>Status</h2>\n    <p id="status">checking the API...</p>\n  </main>\n'
        '  <script src="app.js"></script>\n</body>\n</html>\n'
    )
    server = _fill(_SERVER_PY, FEATURES=features)
    readme = (
        f"# {headline}\n\n{brief.strip()}\n\n## Run it\n\n```\npython server.py 8080\n```\n\n"
        "Then open http://127.0.0.1:8080/. `index.html` is the page, `app.js` checks the "
        "API, `server.py` serves both and answers `/api/health` and `/api/features`; "
        "`python check.py` checks that it does.\n\n"
        f"## Features\n\n{_bullets(features)}\n"
    )
    return [
        PlannedStep("Scaffold the page",
                    f"I'll start with the page for {headline}: index.html lists what the "
                    "brief asks for and app.js checks the API.",
                    [_write("index.html", page), _write("app.js", _APP_JS),
                     _commit(f"Scaffold the page for {headline}")]),
        PlannedStep("Add the API server and README",
                    "Next, a small standard-library server that serves the page and a JSON "
                    "API, and a README that says how to run it.",
                    [_write("server.py", server), _write("check.py", _CHECK_PY),
                     _write("README.md", readme),
                     _commit("Add the API server stub, its check and README")]),
        PlannedStep("Check the build",
                    "Finally I'll run the build's own check in the sandbox and take a "
                    "screenshot of the page.",
                    [PlannedCall("run_command", {"command": "python3 check.py"}),
                     PlannedCall("take_screenshot", {"path": "index.html",
                                                     "caption": f"{headline}: first build"}),
                     _commit("Add a picture of the first build")]),
    ]


# ---------------------------------------------------------------- bot-builder

_BOT_PY = '''"""A command bot: reads one message per line on stdin and prints the reply."""

import sys

NAME = __NAME__
ABOUT = __ABOUT__
TOPICS = __TOPICS__


def reply(message: str) -> str:
    """Answer one incoming message."""
    text = message.strip()
    command = text.split()[0].lower() if text else ""
    if command == "/start":
        return f"Hi! I am {NAME}. Send /help to see what I can do."
    if command == "/help":
        return "Commands: /start, /help, /about, /topics. Or just mention a topic."
    if command == "/about":
        return ABOUT
    if command == "/topics":
        return "I know about: " + ", ".join(TOPICS)
    mentioned = [topic for topic in TOPICS if topic in text.lower()]
    if mentioned:
        return f"You asked about {mentioned[0]}. " + ABOUT
    return "Sorry, I did not understand. Send /help."


def main() -> None:
    for line in sys.stdin:
        print(reply(line), flush=True)


if __name__ == "__main__":
    main()
'''

_BOT_TEST = '''from bot import NAME, TOPICS, reply


def test_start_greets_by_name():
    assert NAME in reply("/start")


def test_topics_are_recognised():
    for topic in TOPICS:
        assert topic in reply("/topics")


def test_unknown_message_points_to_help():
    assert "/help" in reply("xyzzy")


if __name__ == "__main__":
    for name, test in list(globals().items()):
        if name.startswith("test_"):
            test()
    print("bot tests passed")
'''


def bot_plan(brief: str, project: Mapping[str, Any]) -> list[PlannedStep]:
    headline = _headline(brief, project)
    topics = _keywords(brief, 5) or ["help"]
    bot = _fill(_BOT_PY, NAME=headline, ABOUT=" ".join(brief.split()), TOPICS=topics)
    readme = (
        f"# {headline}\n\n{brief.strip()}\n\n## Commands\n\n"
        "- `/start`: greeting\n- `/help`: the command list\n- `/about`: what the bot is for\n"
        f"- `/topics`: the topics it recognises ({', '.join(topics)})\n\n"
        "## Run it\n\n```\npython bot.py        # one message per line on stdin\n"
        "python test_bot.py   # runs its tests (python -m pytest does too)\n```\n"
    )
    return [
        PlannedStep("Write the bot",
                    f"I'll write {headline} as a small command bot whose topics come from "
                    "the brief.",
                    [_write("bot.py", bot), _commit(f"Add the {headline} command bot")]),
        PlannedStep("Document and test the bot",
                    "Now a README with the commands and tests for the replies.",
                    [_write("README.md", readme), _write("test_bot.py", _BOT_TEST),
                     PlannedCall("run_command", {"command": "python3 -B test_bot.py"}),
                     _commit("Document the bot and test its replies")]),
    ]


# ---------------------------------------------------------------- content-machine

def content_plan(brief: str, project: Mapping[str, Any]) -> list[PlannedStep]:
    headline = _headline(brief, project)
    angles = _sentences(brief)[:3]
    keywords = _keywords(brief, 6)
    posts: list[tuple[str, str, str]] = []
    for number, angle in enumerate(angles, start=1):
        title = angle.rstrip(".!?")
        path = f"posts/{number:02d}-{_slug(title)}.md"
        body = (
            f"---\ntitle: {json.dumps(title)}\nseries: {json.dumps(headline)}\n---\n\n"
            f"# {title}\n\n{angle}\n\n## In this series\n\n"
            f"Part {number} of {len(angles)} in the series on {headline}.\n\n"
            f"## Key points\n\n{_bullets(_keywords(angle, 3) or [title])}\n"
        )
        posts.append((title, path, body))
    plan_md = (f"# Content plan: {headline}\n\n{brief.strip()}\n\n## Posts\n\n"
               + "\n".join(f"{n}. {title} (`{path}`)" for n, (title, path, _) in
                           enumerate(posts, start=1))
               + f"\n\n## Keywords\n\n{', '.join(keywords) or 'none found'}\n")
    index = (
        '<!doctype html>\n<html lang="en">\n<head>\n  <meta charset="utf-8">\n'
        f"  <title>{html.escape(headline)}</title>\n</head>\n<body>\n"
        f"  <h1>{html.escape(headline)}</h1>\n"
        + "".join(f'  <h2><a href="{path}">{html.escape(title)}</a></h2>\n'
                  for title, path, _ in posts)
        + "</body>\n</html>\n"
    )
    return [
        PlannedStep("Outline the content plan",
                    f"I'll plan {len(posts)} posts for {headline}, one per idea in the brief.",
                    [_write("content-plan.md", plan_md), _commit("Outline the content plan")]),
        PlannedStep("Write the posts",
                    "Now the posts themselves, as markdown with front matter.",
                    [*(_write(path, body) for _, path, body in posts),
                     _commit(f"Write {len(posts)} posts")]),
        PlannedStep("Publish the index page",
                    "Last, an index page that links every post, and a picture of it.",
                    [_write("index.html", index),
                     PlannedCall("take_screenshot", {"path": "index.html"}),
                     _commit("Add the index page of the posts")]),
    ]


# ---------------------------------------------------------------- research-agent

def research_plan(brief: str, project: Mapping[str, Any]) -> list[PlannedStep]:
    headline = _headline(brief, project)
    questions = [sentence.rstrip(".!?") for sentence in _sentences(brief)]
    keywords = _keywords(brief, 8)
    outline = (
        f"# Research report: {headline}\n\n## Question\n\n{brief.strip()}\n\n"
        f"## Questions to investigate\n\n{_bullets(questions)}\n\n"
        "## Findings\n\n(to be written)\n\n## Next steps\n\n(to be written)\n"
    )
    report = (
        f"# Research report: {headline}\n\n## Question\n\n{brief.strip()}\n\n"
        f"## Key terms\n\n{_bullets(keywords or ['none found'])}\n\n"
        f"## Questions to investigate\n\n{_bullets(questions)}\n\n"
        "## Findings\n\n"
        + "\n".join(f"### {question}\n\nOpen: needs sources on "
                    f"{', '.join(_keywords(question, 3)) or 'this point'}.\n"
                    for question in questions)
        + "\n## Method and limitations\n\nThis report was drafted offline from the brief "
        "alone. No sources were consulted, so it frames the questions and records no "
        "findings.\n\n## Next steps\n\n"
        + _bullets([f"Find primary sources on {term}." for term in keywords[:3]]
                   + ["Answer each question above with cited evidence."])
        + "\n"
    )
    return [
        PlannedStep("Frame the research question",
                    f"I'll frame the questions the brief raises about {headline}.",
                    [_write("report.md", outline), _commit("Outline the research report")]),
        PlannedStep("Write the report",
                    "Now the full report: key terms, the questions, and what is still open. "
                    "I have no sources offline, so the findings say so.",
                    [_write("report.md", report), _commit("Write the research report")]),
    ]
