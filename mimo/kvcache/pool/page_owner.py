"""PageOwner: how `DualPool` learns which pages in a request's tables are not the request's.

A prefix cache shares pages with requests: the same physical page sits in the cache and in
a request's page table. The pool must then never free such a page when the request ends,
rolls back or releases its window. The pool asks its owner (`DualPool.attach_owner`), and
only through these two methods; with no owner attached every page is the request's own.

Contract: the answer for a page may change only between pool calls (the owner takes or
gives up pages inside its own methods, never while the pool is freeing), and a page the
owner claims is one it frees itself.
"""
from __future__ import annotations

from typing import Protocol


class PageOwner(Protocol):
    def owns_full(self, page: int) -> bool:
        """Whether this full-pool page is the owner's (shared: no request frees it)."""
        ...

    def owns_swa(self, page: int) -> bool:
        """Whether this SWA-pool page is the owner's."""
        ...


class NoOwner:
    """No pages are shared: what a pool without a prefix cache asks."""

    def owns_full(self, page: int) -> bool:
        return False

    def owns_swa(self, page: int) -> bool:
        return False


NO_OWNER = NoOwner()
