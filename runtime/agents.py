"""Types that agent tools and agent templates are made of.

Plugins return these from the ``flowsvc_agent_tools`` and ``flowsvc_agent_templates``
hooks; the runtime only collects them into registries. The agent loop that uses them
lives in the projects plugin, and the marketplace validates tool prices against the
same tool registry.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import trio

    from runtime.sandbox import Sandbox

JsonObject = dict[str, Any]


@dataclass(frozen=True)
class ToolContext:
    """What a tool may touch while it runs: one project's workspace, nothing else.

    ``workspace`` is the work tree of the project's own git repository (whose git
    directory lies outside it); tools must refuse any path that resolves outside it
    (traversal or symlinks). ``sandbox`` is the service's one sandbox
    (``runtime.sandbox``): any tool that runs a program runs it there, never on the host.
    ``run_nursery`` lives exactly as long as the run: what a tool starts in it (a preview
    server) is cancelled when the run ends, however it ends.
    """

    workspace: Path
    allow_commands: bool = False
    command_timeout: float = 30.0
    public_base_url: str = "http://127.0.0.1:8000"
    project_slug: str = ""
    sandbox: Sandbox | None = None
    run_nursery: trio.Nursery | None = None


@dataclass(frozen=True)
class CommitInfo:
    """A real git commit made by a tool; becomes the ``commit`` stream event."""

    sha: str
    message: str
    files: list[str]


@dataclass(frozen=True)
class ScreenshotInfo:
    """A picture of the build made by a tool; becomes the ``screenshot`` stream event.

    ``path`` is the picture's path in the work tree, when it is kept there: the runner
    stores the file with the event, so that every host serves ``url`` at once.
    """

    url: str
    caption: str | None = None
    path: str | None = None


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one tool call.

    ``error`` is set when the call failed in a way the model should see and may
    recover from; ``commit`` and ``screenshot`` ask the runner to emit those events.
    """

    result: Any = None
    error: str | None = None
    commit: CommitInfo | None = None
    screenshot: ScreenshotInfo | None = None


ToolFunction = Callable[[ToolContext, JsonObject], Awaitable[ToolResult]]


@dataclass(frozen=True)
class Tool:
    """One entry of the platform's allowed tool list.

    ``parameters`` is the JSON Schema of the arguments, sent as-is to models that
    support tool calling. ``needs`` names what the tool needs of the sandbox
    (``commands`` or ``browser``): a tool that needs what the sandbox cannot offer on
    this host is not offered to models.
    """

    name: str
    description: str
    parameters: JsonObject
    run: ToolFunction
    needs: Literal["commands", "browser"] | None = None


@dataclass(frozen=True)
class PlannedCall:
    """One tool call of an offline plan: the tool name and its arguments."""

    tool: str
    args: JsonObject


@dataclass(frozen=True)
class PlannedStep:
    """One step of an offline plan: a title, what the assistant says, the calls it makes."""

    title: str
    say: str
    calls: list[PlannedCall] = field(default_factory=list)


@dataclass(frozen=True)
class AgentTemplate:
    """A preset an agent run can be started from (the project's ``agentTemplate``).

    ``system_prompt`` steers a real model; ``offline_plan`` turns a brief into the
    fixed plan the offline backend plays through the same tools.
    """

    name: str
    description: str
    system_prompt: str
    offline_plan: Callable[[str, Mapping[str, Any]], list[PlannedStep]]
