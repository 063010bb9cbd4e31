"""EncoderPool: worker processes with their own caches. A key's worker is fixed by the hash
ring; a repeat on that worker is a hit without a forward, while another worker (its own
cache) has not seen it; embeddings equal the in-process tower's."""
import pytest
import torch

from mimo import LLM
from mimo.models.tiny import qwen2_5_vl as tiny
from mimo.multimodal.encoder_pool import EncoderPool


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_qwen2_5_vl")
    tiny.write(d, seed=3)
    return d


GRID = (1, 8, 8)


@pytest.fixture(scope="module")
def patches(tiny_dir):
    """One image's patches and the in-process tower's embeddings of them."""
    model = LLM(str(tiny_dir), dtype="float32", kv_cache_memory="2MiB", progress=False).engine.model
    px = torch.randn(64, 3 * 2 * 14 * 14, generator=torch.Generator().manual_seed(0))
    return px, model.encode(px, [GRID])


@pytest.fixture
def pool(tiny_dir):
    """Two workers; afterwards every process the pool ran (restarts included) is gone."""
    p = EncoderPool(str(tiny_dir), 2, torch.float32, 1 << 24)
    try:
        yield p
    finally:
        procs = list(p._procs.values())
        p.close()
    assert procs and not any(x.is_alive() for x in procs)


def test_workers_cache_their_own_keys(pool, patches):
    (px, want), grid = patches, GRID
    keys = [f"key-{i}" for i in range(16)]
    assert {pool.route(k) for k in keys} == set(pool.names)     # both get keys
    assert all(pool.route(k) == pool.route(k) for k in keys)
    k = keys[0]
    home = pool.route(k)
    other = next(w for w in pool.names if w != home)
    first = pool.encode(home, [k, k], [(px, grid), (px, grid)])
    assert (first.hits, first.misses, first.forwarded) == (0, 2, True)
    torch.testing.assert_close(first.embeds[0], want, atol=1e-5, rtol=0)
    assert torch.equal(first.embeds[0], first.embeds[1])
    again = pool.encode(home, [k], [(px, grid)])
    assert (again.hits, again.misses, again.forwarded) == (1, 0, False)
    assert torch.equal(again.embeds[0], first.embeds[0])
    elsewhere = pool.encode(other, [k], [(px, grid)])
    assert (elsewhere.hits, elsewhere.misses, elsewhere.forwarded) == (0, 1, True)
    with pytest.raises(RuntimeError, match="encoder-"):
        pool.encode(home, ["bad"], [(px[:5], grid)])             # rows do not fit the grid
    assert pool.encode(home, [k], [(px, grid)]).hits == 1       # the worker lives on


def test_a_dead_worker_is_restarted_and_the_call_retried(pool, patches):
    (px, want), grid = patches, GRID
    w, other = pool.names
    assert pool.encode(w, ["a"], [(px, grid)]).misses == 1
    dead, kept = pool._procs[w], pool._procs[other]
    dead.kill()                              # as the OOM killer would
    dead.join(timeout=10)
    reply = pool.encode(w, ["a"], [(px, grid)])
    # A fresh process: its cache is empty, the embeddings are the same.
    assert (reply.hits, reply.misses, reply.forwarded) == (0, 1, True)
    torch.testing.assert_close(reply.embeds[0], want, atol=1e-5, rtol=0)
    assert pool.restarts == 1 and pool._procs[w].pid != dead.pid
    assert pool._procs[other] is kept and kept.is_alive()
    assert pool.encode(w, ["a"], [(px, grid)]).hits == 1


def test_workers_share_a_shared_memory_cache(tiny_dir, patches):
    """With a shared segment, a key one worker encoded is a hit on the other (no forward),
    with the same embeddings; the segment is gone once the pool closes."""
    import os
    import uuid

    from mimo.multimodal.embed_store import ShmSpec
    (px, want), grid = patches, GRID
    name = f"mimo-test-{uuid.uuid4().hex[:10]}"
    p = EncoderPool(str(tiny_dir), 2, torch.float32, 1 << 24, shm=ShmSpec(name, 1 << 22))
    try:
        a, b = p.names
        first = p.encode(a, ["k"], [(px, grid)])
        assert (first.hits, first.forwarded) == (0, True)
        again = p.encode(b, ["k"], [(px, grid)])
        assert (again.hits, again.forwarded) == (1, False)
        assert torch.equal(again.embeds[0], first.embeds[0])
        torch.testing.assert_close(again.embeds[0], want, atol=1e-5, rtol=0)
        assert len(p.fingerprint) == 32
    finally:
        p.close()
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(name)]
