"""Contract: a user's feature flags (the ``flowsvc_user_features`` hook; billing grants them).

Flags from every plugin are OR-ed by ``Service.features``. Each flag changes behaviour a
client can observe; the plugin that reads a flag says how in its docs.
"""

from __future__ import annotations

from typing import Final, Literal

Feature = Literal["priorityQueue", "premiumAgents", "fasterSse", "privateProjects",
                  "dedicatedRuntime"]
FEATURES: Final[tuple[Feature, ...]] = (
    "priorityQueue", "premiumAgents", "fasterSse", "privateProjects", "dedicatedRuntime")
