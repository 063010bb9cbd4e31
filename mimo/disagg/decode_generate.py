"""DecodeGenerate: a decode worker's generate stage. A request that names a prefill worker
(`ChatRequest.prefill_url`, from the router) gets its prompt's KV and first token from
there, then decodes on this worker; any other request runs here whole, as `Generate`.

The first token is the prefill worker's when it is the token this request would sample
(plain greedy: no grammar, biases, penalties, min_tokens or logprobs, which would need the
request's own logits): it is streamed once the KV arrived, and the engine continues after
it. Otherwise the decode worker computes the last
prompt token itself on the transferred KV of the rest, and samples the first token under the
request's own settings. A transfer that fails or times out (`TransferFailed`) runs the
request here from scratch: never an error, never a different token.
"""
from __future__ import annotations

import logging

from ..engine.async_engine import AsyncEngine
from ..engine.sampling_params import SamplingParams
from ..stages.chat_request import ChatRequest
from ..stages.generate import Generate, Generated
from .prefill_client import PrefillClient
from .wire import TransferFailed

log = logging.getLogger("mimo.disagg")


def takes_remote_first_token(p: SamplingParams) -> bool:
    """Whether the prefill worker's greedy first token is the one this request samples."""
    return p.greedy and not p.needs_logits


class DecodeGenerate(Generate):
    name = "generate"

    def __init__(self, engine: AsyncEngine, client: PrefillClient):
        super().__init__(engine)
        self.client = client
        self.recomputed = 0         # requests run here whole after a failed transfer

    async def process(self, req: ChatRequest, upstream=None):
        url = req.prefill_url
        if url is None or req.mm_prompt is not None:
            async for g in super().process(req):
                yield g
            return
        self._check_context(req)
        if req.arrival is not None:     # its prompt is computed elsewhere first: not soon
            req.arrival.close()
        try:
            got = await self.client.prefill(url, req.prompt_ids, req.cache)
        except TransferFailed as e:
            log.warning("KV transfer failed (%s): recomputing the request here", e)
            self.recomputed += 1
            async for g in super().process(req):
                yield g
            return
        first = got.first_token if takes_remote_first_token(req.params) else None
        stream = self.engine.submit_imported(req.prompt_ids, req.params, got.payload, first,
                                             got.cached_tokens, req.cache)
        req.cached_tokens = got.cached_tokens
        if first is not None:
            done = stream.seq.finish_reason
            yield Generated([first], done)
            if done is not None:
                return
        async for g in self.follow(req, stream):
            yield g
