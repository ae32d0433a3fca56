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
    "Work only through the tools: write_file, read_file, list_files, git_commit, "
    "take_screenshot, fetch_url (one public web page, as text) and, when allowed, "
    "run_command. Commit after each coherent step with "
    "a short imperative message. Start your first reply with a numbered plan."
)


def builtin_templates() -> list[AgentTemplate]:
    """Return the four presets of the Project ``agentTemplate`` enum."""
    return [
        AgentTemplate(
            "fullstack-builder", "Builds a small web app: page, script, API server stub, README.",
            "You build small full-stack web apps from a one-paragraph brief: an index.html, "
            "its JavaScript, a minimal API server and a README. Take a screenshot of the "
            f"page once it exists. {_TOOLS_GUIDE}",
            fullstack_plan),
        AgentTemplate(
            "bot-builder", "Builds a command bot with tests and a README.",
            "You build chat bots from a one-paragraph brief: bot.py with clear commands, "
            f"tests of its replies and a README. {_TOOLS_GUIDE}",
            bot_plan),
        AgentTemplate(
            "content-machine", "Plans and writes a series of markdown posts with an index page.",
            "You plan and write series of markdown posts from a one-paragraph brief: a "
            "content plan, one file per post under posts/, and an index.html linking them. "
            f"{_TOOLS_GUIDE}",
            content_plan),
        AgentTemplate(
            "research-agent", "Writes a structured research report (report.md).",
            "You write research reports from a one-paragraph brief: report.md with the "
            "question, key terms, questions to investigate, findings with their sources, "
            "limitations and next steps. Read sources with fetch_url and cite their URLs; "
            f"never invent sources. {_TOOLS_GUIDE}",
            research_plan),
    ]
