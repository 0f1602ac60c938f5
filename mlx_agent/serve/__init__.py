"""The OpenAI- and Ollama-compatible server: :mod:`.schema` (request bodies), :mod:`.render`
(prompts and replies), :mod:`.service` (the model behind it), :mod:`.app` (HTTP)."""

from .app import make_app
from .service import ChatCall, ChatResult, ChatService

__all__ = ["ChatCall", "ChatResult", "ChatService", "make_app"]
