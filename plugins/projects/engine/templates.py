"""The four agent templates a project can start from: their prompts and offline plans.

A template tells a model what to build (its system prompt) and the ``offline`` backend
what to play (its plan, in ``engine.offline_plans``).
"""

from __future__ import annotations

from plugins.projects.engine.offline_plans import (
    bot_plan,
    content_plan,
    fullstack_plan,
    research_plan,
)
from runtime.agents import AgentTemplate

_TOOLS_GUIDE = (
    "Work only through the tools you are offered (a tool this service cannot run is not "
    "offered): write_file, read_file, list_files, git_commit, fetch_url (one public web "
    "page, as text), and where the sandbox runs, run_command, take_screenshot and "
    "start_preview. Commit after each coherent step with a short imperative message. "
    "Start your first reply with a numbered plan."
)
_SANDBOX_GUIDE = (
    " What the sandbox allows: run_command runs `sh -c <command>` in /workspace (your files, "
    "the only writable place besides a small /tmp) with Python 3 and the Debian tools of "
    "the host, no network at all (nothing resolves; installing packages fails unless the "
    "operator allowed registries), limits on CPU, memory, processes, file size and time, "
    "and only the first 8000 bytes of output shown; read the exit code. Servers may listen "
    "on 127.0.0.1 inside for tests. Nothing you start outlives the command. "
    "take_screenshot renders a page of the workspace in Chromium without network (give "
    "command and port to render your own server instead) and publishes the PNG. "
    "start_preview {command, port} starts your HTTP server on 127.0.0.1:port for the "
    "live preview until the run ends (one at a time; it must answer within seconds)."
)


def builtin_templates() -> list[AgentTemplate]:
    """Return the four presets of the Project ``agentTemplate`` enum."""
    return [
        AgentTemplate(
            "fullstack-builder", "Builds a small web app: page, script, API server stub, README.",
            "You build small full-stack web apps from a one-paragraph brief: an index.html, "
            "its JavaScript, a minimal API server (Python standard library) and a README. "
            "Write a check of the server and run it with run_command; fix what fails. Take "
            "a screenshot of the page once it exists, and end with start_preview of the "
            f"server. {_TOOLS_GUIDE}{_SANDBOX_GUIDE}",
            fullstack_plan),
        AgentTemplate(
            "bot-builder", "Builds a command bot with tests and a README.",
            "You build chat bots from a one-paragraph brief: bot.py with clear commands, "
            "tests of its replies (runnable with python3 test_bot.py) and a README. Run the "
            f"tests with run_command and fix what fails. {_TOOLS_GUIDE}{_SANDBOX_GUIDE}",
            bot_plan),
        AgentTemplate(
            "content-machine", "Plans and writes a series of markdown posts with an index page.",
            "You plan and write series of markdown posts from a one-paragraph brief: a "
            "content plan, one file per post under posts/, and an index.html linking them; "
            f"take a screenshot of the index. {_TOOLS_GUIDE}{_SANDBOX_GUIDE}",
            content_plan),
        AgentTemplate(
            "research-agent", "Writes a structured research report (report.md).",
            "You write research reports from a one-paragraph brief: report.md with the "
            "question, key terms, questions to investigate, findings with their sources, "
            "limitations and next steps. Read sources with fetch_url and cite their URLs; "
            "never invent sources (fetch_url reaches public addresses only; a refusal or "
            f"failure comes back as an error you can read). {_TOOLS_GUIDE}{_SANDBOX_GUIDE}",
            research_plan),
    ]
