"""A request's cache scope, and the prefix-cache namespace it keys its KV under.

The namespace is the one place a request's KV key space is made: the radix tree keeps a root
per namespace, and the tiers' page keys (host, disk, Redis), the router's published state
and its own prediction all chain from `KeyChain.root(namespace)`, so whatever enters here
separates KV at every tier at once. Its parts:
- media: the hash of a multimodal prompt's items (placeholder ids alone are the same for
  any picture);
- salt (`cache_salt`): KV made under a salt is reusable only by requests with the same
  salt (vLLM mixes it into the first block's hash; here it is part of the root key, which
  every page key chains from). A request without one shares with other saltless ones.

A request's `session` (`prompt_cache_key`) does not separate anything: requests with and
without one share KV. It marks what the request leaves cached as a session's, which
eviction keeps after what keyless requests left (`RadixTree.insert(protect=)`).
"""
from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

MAX_SCOPE_CHARS = 256       # a salt's or a session key's length limit


def check_scope_string(v: object, name: str) -> str | None:
    """`v` if it is None or a non-empty string of at most MAX_SCOPE_CHARS characters;
    else ValueError naming `name`."""
    if v is None:
        return None
    if not isinstance(v, str):
        raise ValueError(f"'{name}' must be a string, got {type(v).__name__}")
    if not v or len(v) > MAX_SCOPE_CHARS:
        raise ValueError(f"'{name}' must be 1 to {MAX_SCOPE_CHARS} characters, got {len(v)}")
    return v


@dataclass(frozen=True)
class CacheScope:
    salt: str | None = None         # cache_salt: KV shared only under the same salt
    session: str | None = None      # prompt_cache_key: a session's cache, evicted last

    def __post_init__(self) -> None:
        check_scope_string(self.salt, "cache_salt")
        check_scope_string(self.session, "prompt_cache_key")


def request_namespace(media_key: str | None = None, salt: str | None = None) -> Hashable:
    """The namespace of a prompt with these media (their `media_cache_key`, None for text)
    under this salt: None for plain saltless text, as before salts existed."""
    parts: tuple[str, ...] = ()
    if media_key is not None:
        parts += ("media", media_key)
    if salt is not None:
        parts += ("salt", salt)
    return parts or None
