"""bench route's trace slice: conversations whose starts spread over the trace, each request's
parent an earlier one whose blocks begin its own; and text prompts that keep shared blocks
shared tokens."""
from __future__ import annotations

from pathlib import Path

from mimo.bench.route_load import WORDS, conversations
from mimo.bench.sim_cache import load_trace

TRACE = Path(__file__).resolve().parents[2] / "data" / "traces" / "conversation_trace.jsonl"


def test_the_slice_spreads_conversations_over_the_trace_and_keeps_their_parents():
    rows = load_trace(str(TRACE))
    picked, parents = conversations(rows, 200)
    assert 150 <= len(picked) <= 260
    t = [r["timestamp"] for r in picked]
    assert t == sorted(t)
    roots = [picked[j]["timestamp"] for j, p in enumerate(parents) if p is None]
    first, last = rows[0]["timestamp"], max(r["timestamp"] for r in rows)
    # Starts over most of the hour, not its first minutes (the old slice: within 4 minutes).
    assert max(roots) - min(roots) > 0.8 * (last - first)
    assert sum(p is not None for p in parents) >= len(picked) / 2
    for j, p in enumerate(parents):
        if p is None:
            continue
        assert p < j
        mine, theirs = picked[j]["hash_ids"], picked[p]["hash_ids"]
        k = len(theirs) - 1          # the parent's last block may be partial
        assert k >= 1 and mine[:k] == theirs[:k]


def test_every_word_of_a_text_prompt_is_one_gemma_token():
    from mimo.router.prompt import PromptBuilder
    pb = PromptBuilder("gemma-3-270m")
    words = [WORDS[(7 * i) % len(WORDS)] for i in range(300)]
    ids = pb.prompt_ids("completion", {"model": "m", "prompt": " ".join(words)})
    assert len(ids) == 1 + len(words)        # BOS and one token per word
    other = pb.prompt_ids("completion", {"model": "m",
                                         "prompt": " ".join(words[:100] + ["river"] * 5)})
    assert other[:101] == ids[:101]
