"""Brute-force model of the SWA-aware radix tree, written from the definitions alone.

The cache is a flat dict: (namespace, tokens of a whole-page prefix) -> [full page, SWA
page or -1]. No tree, no splitting, no jumping search: every question is answered by
trying every candidate.
"""
from __future__ import annotations


def window_positions(end: int, window: int) -> range:
    """Positions whose SWA KV a query at `end` reads from the cache: keys (end - W, end)."""
    return range(max(end - window + 1, 0), end)


def needed_pages(end: int, window: int, page: int) -> set[int]:
    return {pos // page for pos in window_positions(end, window)}


def key(ns, toks, i, page):
    return (ns, tuple(toks[:(i + 1) * page]))


def prefix_pages(flat, ns, toks, page, limit=None) -> int:
    """Whole pages of toks present in the cache, from the start."""
    n, limit = 0, len(toks) // page if limit is None else limit
    while n < limit and key(ns, toks, n, page) in flat:
        n += 1
    return n


def safe_pages(live, q: int, window: int, page: int) -> int:
    """Largest p <= q such that live(i) holds for every page the window before p*page needs."""
    for p in range(q, 0, -1):
        if all(live(i) for i in needed_pages(p * page, window, page)):
            return p
    return 0


def brute_match(flat, ns, toks, page, window, hybrid=True) -> tuple[int, int]:
    """(window-safe length, token-equal length) of toks against the cache."""
    m = prefix_pages(flat, ns, toks, page)
    if not hybrid:
        return m * page, m * page
    q = safe_pages(lambda i: flat[key(ns, toks, i, page)][1] >= 0, m, window, page)
    return q * page, m * page


def brute_insert(flat, ns, toks, full, swa, page, window, hybrid=True, align=None):
    """Apply an insert under the keep-everything retention policy. Returns the pages the
    caller must free (full, SWA) and the (tree full page, SWA page) revivals."""
    align = align or page
    swa = [s if s is not None and s >= 0 else -1 for s in (swa or [])]
    swa += [-1] * (len(full) - len(swa))
    n = min(len(full), len(toks) // page)
    m = prefix_pages(flat, ns, toks, page, n)
    q_end = len(toks) // align * align // page
    before = {i: list(flat[key(ns, toks, i, page)]) for i in range(m)}
    if hybrid:
        q_end = safe_pages(lambda i: (i < m and before[i][1] >= 0) or swa[i] >= 0,
                           q_end, window, page)
    kept_f, kept_s, remap = set(), set(), []
    for i in range(m):
        entry = flat[key(ns, toks, i, page)]
        if full[i] == entry[0]:
            kept_f.add(full[i])
        if hybrid and swa[i] >= 0:
            if entry[1] == swa[i]:
                kept_s.add(swa[i])
            elif entry[1] < 0 and i < len(toks) // align * align // page:
                entry[1] = swa[i]
                kept_s.add(swa[i])
                if full[i] != entry[0]:
                    remap.append((entry[0], swa[i]))
    for i in range(m, q_end):
        flat[key(ns, toks, i, page)] = [full[i], swa[i] if hybrid else -1]
        kept_f.add(full[i])
        if hybrid and swa[i] >= 0:
            kept_s.add(swa[i])
    # A page the cache holds is never handed back, even where the caller's tokens no
    # longer cover the pages it matched.
    held_f = {v[0] for v in flat.values()}
    held_s = {v[1] for v in flat.values() if v[1] >= 0}
    dup_f = [p for p in full if p not in kept_f and p not in held_f]
    dup_s = [s for s in swa if s >= 0 and s not in kept_s and s not in held_s]
    return dup_f, dup_s, remap


def flatten(tree) -> dict:
    """The tree's contents as the model's flat dict."""
    out = {}
    P = tree.P
    for ns, root in tree.paths.roots.items():
        stack = [(c, ()) for c in root.children.values()]
        while stack:
            node, pre = stack.pop()
            toks = pre + tuple(node.tokens)
            for i in range(len(node.full)):
                k = (ns, toks[:len(pre) + (i + 1) * P])
                out[k] = [node.full[i], node.swa[i] if node.swa is not None else -1]
            stack.extend((c, toks) for c in node.children.values())
    return out
