"""Request and response models of the marketplace routes (they also document /openapi.json).

``monetization`` is typed ``Any`` on purpose: every problem with it, even a wrong JSON type,
is ``invalid_monetization`` (``monetization.parse_monetization``), not ``invalid_request``.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    RootModel,
    StrictFloat,
    StrictInt,
    StrictStr,
)
from pydantic import StringConstraints as Text

from plugins.marketplace.catalog import MAX_TAGS, SLUG_PATTERN, TAG_PATTERN
from plugins.marketplace.ranking import Sort
from runtime.inputs import Body


def _lowercase(value: object) -> object:
    return value.strip().lower() if isinstance(value, str) else value


Tag = Annotated[str, BeforeValidator(_lowercase), Text(pattern=TAG_PATTERN)]
Name = Annotated[str, Text(strip_whitespace=True, min_length=1, max_length=100)]
Description = Annotated[str, Text(strip_whitespace=True, min_length=1, max_length=4000)]
Instructions = Annotated[str, Text(max_length=8000)]
MAX_TOOL_PRICES = 100


class CreateAgentRequest(Body):
    """``POST /agents``: a draft agent (publish it to list it)."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"name": "Token researcher", "description": "Writes a sourced report on a token.",
         "agentTemplate": "research-agent", "tags": ["research", "defi"]}]})

    name: Name
    description: Description
    agentTemplate: str = Field(min_length=1, max_length=64,
                               description="one of the platform's agent templates")
    instructions: Instructions = ""
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS)
    slug: str | None = Field(None, pattern=SLUG_PATTERN,
                             description="made from the name when omitted")
    monetization: Any = Field(None, description="free (default), per_call or subscription")
    premium: bool = False


class AgentFromProjectRequest(Body):
    """``POST /agents/from-project``: an agent made from a project whose run completed."""

    projectSlug: str = Field(min_length=1, max_length=64)
    name: Name | None = None
    description: Description | None = None
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS)
    slug: str | None = Field(None, pattern=SLUG_PATTERN)
    monetization: Any = None
    premium: bool = False


class PublishRequest(Body):
    """``POST /agents/:slug/publish``: every field optional; an empty body only publishes."""

    name: Name | None = None
    description: Description | None = None
    instructions: Instructions | None = None
    tags: list[Tag] | None = Field(None, max_length=MAX_TAGS)
    monetization: Any = None
    premium: bool | None = None


class ToolPriceEntry(Body):
    tool: str = Field(min_length=1, max_length=64)
    perCallFlow: StrictStr | StrictInt | StrictFloat = Field(
        description="FLOW per call, at most 6 decimals; a decimal string is preferred")


class ToolPricesRequest(RootModel[list[ToolPriceEntry]]):
    """``POST /agents/:slug/tool-prices``: the agent's complete price list."""

    root: list[ToolPriceEntry] = Field(max_length=MAX_TOOL_PRICES)


class ListQuery(BaseModel):
    """``GET /marketplace/agents`` query: ``sort``, ``tag``, ``cursor``, ``limit``."""

    sort: Sort | None = None
    tag: Tag | None = None
    cursor: str | None = Field(None, max_length=512)
    limit: int = Field(20, ge=1, description="page size; values over 100 are clamped to 100")


class RatingRequest(Body):
    """``POST /agents/:slug/ratings``: 1 to 5 stars."""

    stars: int = Field(ge=1, le=5)


class RunRequest(Body):
    """``POST /agents/:slug/runs``: the caller's own brief."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"brief": "Compare the fee models of the three largest DEXes on BNB Chain."}]})

    brief: str = Field(min_length=1, max_length=4000)


class RunStarted(BaseModel):
    runId: str
    streamUrl: str


class AgentResponse(BaseModel):
    agent: dict[str, Any]


class AgentsPage(BaseModel):
    agents: list[dict[str, Any]]
    nextCursor: str | None


class ToolPricesResponse(BaseModel):
    toolPrices: list[dict[str, str]]
