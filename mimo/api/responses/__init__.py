"""OpenAI's Responses API (/v1/responses) on top of the chat pipeline: request parsing
(request, items), output items and stream events (output), the store of finished responses
(store: memory or Redis) and the endpoints (handler)."""
from .handler import ResponsesAPI
from .store import MemoryStore, RedisStore, ResponseStore, StoreUnavailable, open_store

__all__ = ["MemoryStore", "RedisStore", "ResponseStore", "ResponsesAPI", "StoreUnavailable",
           "open_store"]
