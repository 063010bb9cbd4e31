"""SWA retention: which SWA pages a finished request leaves live in the prefix tree.

A cached prefix of length L is reusable only if the SWA KV of the window before L is live
(`window_pages`). Keeping every SWA page would cost the full-attention price again (on
MiMo-V2-Flash an SWA token is 8.7x the bytes of a full token), keeping none makes the cache
useless. So a request keeps the window before a few *checkpoints*, the places where a later
request is likely to stop matching and start computing:

- the cached end (always): the next turn of a chat or agent loop continues the whole
  sequence; the tree also requires it (a leaf whose end is not window-safe is dead weight).
  With `output=False` the cached sequence ends with the prompt: models whose next turn
  drops the output (reasoning models do not send their thinking back) never reuse it;
- the prompt end: an identical prompt (a retry, a sampled batch) reuses all of it but its
  last token, and the next turn reuses at least the prompt;
- the branch point: where the request left the tokens already cached. A second request
  that went that way makes it a fork, and forks recur (regenerations, edits, one system
  prompt before many user turns). The first request to branch pays; the next ones hit;
- optional dense checkpoints every `dense_every` tokens (below `dense_upto`, if set):
  system prompts, shared documents and earlier turns are forked at places nobody could
  predict, and a grid of windows lets even the first request to fork there hit. They are
  *speculative*: the tree gives them the lowest SWA priority until a match ends at one, so
  they only occupy SWA room that nothing firm wants, and cost nothing under pressure;
- `spare`: the SWA pages a running prefill offers when it shares its prompt after a chunk
  (the chunk's pages behind its window, which window release would free next) are kept too,
  as speculative as the dense grid. A prompt prefilled in chunks longer than the window then
  leaves a window before every page, not only before each chunk's end, at no cost to the
  request (the pages are the tree's, unlocked, evictable) and none under pressure: a later
  prompt sharing 2,000 tokens of a 3,000-token one prefilled in chunks of 1,536 reuses 2,000
  instead of 1,536.

`align` rounds the cached end and the prompt checkpoint down to a multiple of that many
tokens. Tiered caches and routers key KV by chained hashes of fixed blocks (Mooncake traces:
512 tokens), so reuse across requests happens at block boundaries; a partial tail block is
never reused and is not worth its pages. align=0 means one page.

The engine must apply the same checkpoints *while the request runs*: window release during
prefill frees SWA pages behind the window, so it must skip `keep_pages(...)` or the
checkpoints are gone before the request is inserted.

How these checkpoints compare with the simple rule (one window at the prompt's last full
block) on a real trace: docs/kvcache_measurements.md.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ...config import RETENTION_POLICIES


def window_first_page(end: int, window: int, page: int) -> int:
    """First logical page whose SWA KV a query at position `end` needs: it sees keys
    (end - window, end], so positions [end - window + 1, end) must come from the cache
    (the same boundary `DualPool.release_window` uses)."""
    return max(end - window + 1, 0) // page


def window_pages(end: int, window: int, page: int) -> range:
    """Logical pages that must hold live SWA KV for a prefix of `end` tokens (page-aligned)
    to be reusable."""
    return range(window_first_page(end, window, page), end // page)


@dataclass(frozen=True)
class RetentionPolicy:
    align: int = 0            # tokens; 0: one page. Must be a multiple of the page size.
    prompt: bool = True       # checkpoint at the prompt end
    branch: bool = True       # checkpoint at the branch point
    dense_every: int = 0      # tokens between dense checkpoints (0: none)
    dense_upto: int | None = None   # dense checkpoints only up to this position (None: all)
    keep_all: bool = False    # keep every SWA page offered (tests; "SWA cached like full")
    spare: bool = False       # keep the SWA pages a prefill's sync offers, speculative
    output: bool = True       # cache generated tokens too (False: prompts only)

    def _align(self, page: int) -> int:
        a = self.align or page
        if a % page:
            raise ValueError(f"align={self.align} is not a multiple of the page size {page}")
        return a

    def cache_len(self, total_len: int, page: int, prompt_len: int | None = None) -> int:
        """How much of a sequence with KV for `total_len` tokens is worth caching."""
        a = self._align(page)
        if not self.output and prompt_len:
            total_len = min(total_len, prompt_len)
        return total_len // a * a

    def checkpoints(self, total_len: int, prompt_len: int | None, branch_len: int,
                    page: int, firm_only: bool = False) -> list[int]:
        """Positions (page multiples, ascending, > 0) whose preceding window stays live.

        `branch_len`: tokens of this sequence already in the tree (page-aligned), i.e.
        where it branches off; the engine passes `MatchResult.prefix_len` at admission.
        Dense checkpoints are speculative (`firm_only` leaves them out): the tree gives
        them the lowest SWA priority until a match ends at one, so they only fill SWA
        room nothing else wants.
        """
        end = self.cache_len(total_len, page, prompt_len)
        pts = {end}
        if self.prompt and prompt_len:
            pts.update(min(p, end) for p in self.prompt_points(prompt_len, page))
        if self.branch and 0 < branch_len < end:
            pts.add(branch_len // page * page)
        if self.dense_every > 0 and not firm_only:
            step = max(self.dense_every // page, 1) * page
            upto = end if self.dense_upto is None else min(self.dense_upto, end)
            pts.update(range(step, upto + 1, step))
        return sorted(p for p in pts if p > 0)

    def prompt_points(self, prompt_len: int, page: int) -> set[int]:
        """The prompt-end checkpoints: prompt_len - 1 (an identical prompt reuses all but its
        last token) and prompt_len, aligned down."""
        a = self._align(page)
        return {p // a * a for p in (prompt_len - 1, prompt_len)}

    def keep_pages(self, checkpoints: Iterable[int], window: int, page: int) -> set[int]:
        """Logical pages whose SWA KV the checkpoints need."""
        keep: set[int] = set()
        for c in checkpoints:
            keep.update(window_pages(c, window, page))
        return keep


# Named policies for the benchmark and the engine's config.
POLICIES = {
    # Firm windows at the prompt end (the cached end) and at branch points, speculative ones
    # every 8192 tokens (4096-16384 measure the same on the Mooncake conversation trace);
    # prompts only: for models whose next turn does not resend the output verbatim
    # (MiMo-V2 and other reasoning models drop their thinking from the history).
    "hybrid": RetentionPolicy(dense_every=8192, output=False, spare=True),
    # The same, and the output cached too with a window at its end: chat models and agents
    # whose next request continues the whole sequence.
    "hybrid-output": RetentionPolicy(dense_every=8192, spare=True),
    # The simple rule: one window at the end of the prompt (its last full block when
    # aligned), nothing else.
    "prompt-only": RetentionPolicy(branch=False, output=False),
    # Every SWA page kept: window-safe everywhere, at SWA's full price.
    "keep-all": RetentionPolicy(keep_all=True),
}
# The config validates names without importing this module (configs are data).
assert tuple(POLICIES) == RETENTION_POLICIES, "config.RETENTION_POLICIES is out of date"
