"""A test-only tiny MiMo-V2-Flash checkpoint whose greedy output is one of two fixed texts in
MiMo's real output format, so the server's reasoning and tool-call parsing can be checked
end to end through the real decode path (random weights never write such text).

The checkpoint is `mimo.models.tiny.mimo_v2_flash` (all layers random, 2 MTP layers) with a
tokenizer that adds each chunk of the texts as one token (chunks cut across the markers, so
the parser must hold partial tags back) and three rigged tensors: the chunks' embeddings
are large orthogonal vectors (the random layers only perturb them), the final norm is 1,
and lm_head maps each chunk's direction to its successors: a bigram chain (the MTP layers
pass the embedding through, so they draft the same chain). Where the two texts share a chunk
with different successors (`<think>`, `</think>`) both successors score the same; a request
picks its text with `logit_bias` -100 on the chunks only the other text has (`ban_for`)."""
from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import AddedToken

from mimo.models.tiny import mimo_v2_flash as tiny
from mimo.models.tiny._common import byte_level_bpe, write_checkpoint

THINK, END_THINK, IM_END = "<think>", "</think>", "<|im_end|>"
START = "Ċ"                 # "\n" as a byte-level token: the generation prompt's last token

# A call after the thinking block: get_weather(city="Paris", days=3).
AFTER = [THINK, "The user wants", " the weather in Paris.", END_THINK, "\n\n<tool",
         "_call>\n<function=get_", "weather>\n<parameter=", "city>\nPar",
         "is\n</parameter>\n<parameter=", "days>\n3\n</param", "eter>\n</function>\n</tool_call>",
         IM_END]
# A call inside the thinking block, then an answer: search(query="weather Paris").
INSIDE = [THINK, "Let me look", " it up. ", "<tool_call>\n<function=search>\n",
          "<parameter=query>\nweather Paris\n</parameter>\n", "</function>\n</tool_call>",
          "\nWaiting for the result.", END_THINK, "I will answer once it returns.", IM_END]
TEXTS = {"after": AFTER, "inside": INSIDE}
SPECIAL_IDS = {t: tiny.SPECIAL.index(t) for t in (THINK, END_THINK, IM_END)}

EMBED_NORM, HEAD_SCALE = 100.0, 5.0      # successor logit about 8 x 5 = 40, the rest about 0


def _tokenizer():
    tok = byte_level_bpe(tiny.SPECIAL, vocab_size=400)
    chunks = sorted({c for text in TEXTS.values() for c in text if c not in SPECIAL_IDS})
    tok.add_tokens([AddedToken(c, normalized=False, special=False) for c in chunks])
    assert tok.get_vocab_size() <= tiny.VOCAB
    return tok


def token_ids(tok) -> dict[str, list[int]]:
    """Each text as the token ids the rigged model emits."""
    out = {}
    for name, text in TEXTS.items():
        ids = [tok.token_to_id(c) for c in text]
        assert None not in ids, name
        out[name] = ids
    return out


def _chains(ids: dict[str, list[int]], start: int) -> dict[int, set[int]]:
    """token -> its successors in either text (the start token leads to the first)."""
    succ: dict[int, set[int]] = {}
    for seq in ids.values():
        for a, b in zip([start] + seq[:-1], seq):
            succ.setdefault(a, set()).add(b)
    for seq in ids.values():
        # Within one text every token has one successor, and a fork is between tokens that
        # only one text has (so banning the other text's own tokens decides every fork).
        nxt = dict(zip([start] + seq[:-1], seq))
        assert len(nxt) == len(seq), "a token repeats within one text"
    only = {n: set(s) - set().union(*(o for m, o in ids.items() if m != n)) for n, s in ids.items()}
    for a, bs in succ.items():
        if len(bs) > 1:
            assert all(sum(b in o for o in only.values()) == 1 for b in bs), a
    return succ


def ban_for(tok, name: str) -> dict[str, int]:
    """The logit_bias that makes the model write TEXTS[name]: -100 on the other text's own
    tokens."""
    ids = token_ids(tok)
    mine = set(ids[name])
    others = {t for n, s in ids.items() if n != name for t in s} - mine
    return {str(t): -100 for t in sorted(others)}


def write(out_dir: Path, seed: int = 0) -> None:
    tok = _tokenizer()
    ids = token_ids(tok)
    start = tok.token_to_id(START)
    assert tok.encode("<|im_start|>assistant\n").ids[-1] == start    # CHATML's generation prompt
    succ = _chains(ids, start)
    w = tiny.weights(seed)
    rows = sorted(succ.keys() | {b for bs in succ.values() for b in bs})
    assert len(rows) <= tiny.HIDDEN
    g = torch.Generator().manual_seed(seed + 1)
    basis, _ = torch.linalg.qr(torch.randn(tiny.HIDDEN, tiny.HIDDEN, generator=g))
    direction = {t: basis[:, i] for i, t in enumerate(rows)}
    embed = w["model.embed_tokens.weight"].float()
    for t in rows:
        embed[t] = EMBED_NORM * direction[t]
    head = torch.zeros(tiny.VOCAB, tiny.HIDDEN)
    for a, bs in succ.items():
        for b in bs:
            head[b] += HEAD_SCALE * direction[a]
    w["model.embed_tokens.weight"] = embed.to(torch.bfloat16)
    w["lm_head.weight"] = head.to(torch.bfloat16)
    w["model.norm.weight"] = torch.ones(tiny.HIDDEN, dtype=torch.bfloat16)
    # MTP layer k reads the embedding of the token it follows (and the previous hidden state,
    # dropped here): passed straight on, it drafts the same chain, so drafts are accepted
    # (all but at the forks, where the request's bias decides).
    one = torch.ones(tiny.HIDDEN, dtype=torch.bfloat16)
    for k in range(tiny.N_MTP):
        p = f"model.mtp.layers.{k}."
        eh = torch.zeros(tiny.HIDDEN, 2 * tiny.HIDDEN)
        eh[:, :tiny.HIDDEN] = 10.0 * torch.eye(tiny.HIDDEN)
        w |= {p + "eh_proj.weight": eh.to(torch.bfloat16), p + "enorm.weight": one.clone(),
              p + "final_layernorm.weight": one.clone()}
    write_checkpoint(out_dir, tiny.config(), w, tok,
                     {"eos_token": IM_END, "pad_token": "<|endoftext|>", "bos_token": None,
                      "add_bos_token": False, "chat_template": tiny.CHATML},
                     {"eos_token_id": [tiny.IM_END, tiny.PAD], "pad_token_id": tiny.PAD})
