"""The agent: the loop that runs tools for a model, its conversation, its events."""

from .conversation import Conversation, agent_format
from .loop import Agent, AgentConfig, Outcome, TurnStats

__all__ = ["Agent", "AgentConfig", "Conversation", "Outcome", "TurnStats", "agent_format"]
