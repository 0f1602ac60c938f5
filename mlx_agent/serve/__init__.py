"""The OpenAI- and Ollama-compatible server: :mod:`.schema` (request bodies),
:mod:`.openai_api` and :mod:`.ollama_api` (adapters), :mod:`.service` (the model behind
them), :mod:`.app` (HTTP routes and the model thread), :mod:`.http` (the connection: a
deadline and a cap). Prompts and replies are rendered by :mod:`mlx_agent.formats`, as the
agent renders them."""

from .app import make_app
from .service import ChatCall, ChatResult, ChatService, PreparedChat

__all__ = ["ChatCall", "ChatResult", "ChatService", "PreparedChat", "make_app"]
