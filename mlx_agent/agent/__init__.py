"""The agent: protocols that show tools to the model, the loop that runs them, its events."""

from .loop import Agent, AgentConfig, Outcome
from .protocols import HermesProtocol, JsonProtocol, choose, make_protocol

__all__ = ["Agent", "AgentConfig", "HermesProtocol", "JsonProtocol", "Outcome", "choose",
           "make_protocol"]
