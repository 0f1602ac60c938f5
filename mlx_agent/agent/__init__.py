"""The agent: the loop that runs tools for a model, its conversation, its events.

The names below are imported on first use (:mod:`mlx_agent._lazy`): importing the package,
or its light :mod:`.limits`, loads no model code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import exports

if TYPE_CHECKING:
    from .conversation import Conversation, agent_format
    from .loop import Agent, AgentConfig, Outcome, TurnStats

__all__ = ["Agent", "AgentConfig", "Conversation", "Outcome", "TurnStats", "agent_format"]
__getattr__, __dir__ = exports(__name__, {
    "Conversation": ".conversation", "agent_format": ".conversation",
    "Agent": ".loop", "AgentConfig": ".loop", "Outcome": ".loop", "TurnStats": ".loop"})
