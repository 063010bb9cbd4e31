"""PrefillClient: a decode worker's side of the KV stream: asks a prefill worker for a
prompt's KV and first token and reads the answer into host memory (`wire.decode`).

Whatever goes wrong (connection refused or lost mid-stream, a worker that stalls longer
than `timeout` between bytes, a non-200 answer, a malformed or mismatched stream) raises
`TransferFailed`, which the caller turns into a local recompute."""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from ..kvcache.kv_payload import full_kv_bytes
from ..kvcache.pool.layout import KVLayout
from ..kvcache.radix.namespace import CacheScope
from . import wire
from .transfer_stats import TransferStats

if TYPE_CHECKING:       # imported on a decode worker's first transfer (~70 ms of each start)
    import httpx

PREFILL_PATH = "/v1/internal/prefill"


class PrefillClient:
    def __init__(self, fingerprint: str, layout: KVLayout, page_size: int,
                 timeout: float = 60.0, api_key: str | None = None):
        self.fingerprint, self.layout, self.page_size = fingerprint, layout, page_size
        self.timeout = timeout
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client: httpx.AsyncClient | None = None
        self.stats = TransferStats()

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:        # made on the serving loop, on first use
            import httpx
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(self.timeout, connect=5.0))
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def prefill(self, url: str, prompt_ids: list[int], scope: CacheScope
                      ) -> wire.Prefilled:
        import httpx
        t0 = time.perf_counter()
        body = {"prompt_ids": prompt_ids, "cache_salt": scope.salt, "session": scope.session,
                "fingerprint": self.fingerprint, "wire": wire.VERSION}
        try:
            async with self._http().stream("POST", url.rstrip("/") + PREFILL_PATH, json=body,
                                           headers=self._headers) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread())[:300].decode("utf-8", "replace")
                    raise wire.TransferFailed(f"prefill worker answered {resp.status_code}: "
                                              f"{text}")
                got = await wire.decode(resp.aiter_raw(), self.fingerprint, self.layout,
                                        self.page_size, len(prompt_ids))
        except wire.TransferFailed:
            self.stats.failed += 1
            raise
        except (httpx.HTTPError, OSError, asyncio.TimeoutError) as e:
            self.stats.failed += 1
            raise wire.TransferFailed(f"KV transfer from {url} failed: {e!r}") from e
        st = self.stats
        st.transfers += 1
        st.wire_bytes += got.wire_bytes
        st.kv_bytes += got.payload.nbytes
        st.full_kv_bytes += full_kv_bytes(self.layout, len(prompt_ids))
        st.seconds += time.perf_counter() - t0
        return got
