"""HostStore (one kind of the host-memory tier) against a plain model: an LRU of keys with
pins; random puts, pins and unpins; the rows read back are the rows written, the accounting
balances after every operation, and pinned entries are never evicted."""
import random
from collections import OrderedDict

import torch

from mimo.kvcache.tiers.host_pool import HostPool, HostStore


def test_host_store_matches_an_lru_model():
    for seed in range(20):
        rng = random.Random(seed)
        cap = rng.randint(1, 12)
        store = HostStore("t", cap, 3, torch.float32)
        model: OrderedDict[bytes, float] = OrderedDict()   # key -> value, oldest first
        pins: dict[bytes, int] = {}
        slots_of: dict[bytes, list[int]] = {}
        for _ in range(300):
            op = rng.random()
            if op < 0.6:
                keys = [bytes([rng.randrange(30)]) for _ in range(rng.randint(1, 4))]
                vals = [float(rng.randrange(1000)) for _ in keys]
                rows = torch.tensor(vals).repeat(3, 1).t().contiguous()
                stored = store.put(keys, rows)
                n = 0
                for k, v in zip(keys, vals):
                    if k in model:
                        model.move_to_end(k)
                        continue
                    if len(model) >= cap:
                        victim = next((x for x in model if x not in pins), None)
                        if victim is None:
                            break
                        del model[victim]
                    model[k] = v
                    n += 1
                assert stored == n
            elif op < 0.8 and model:
                k = rng.choice(list(model))
                slots_of.setdefault(k, []).extend(store.pin([k]))
                pins[k] = pins.get(k, 0) + 1
                model.move_to_end(k)
            elif pins:
                k = rng.choice(list(pins))
                store.unpin([slots_of[k].pop()])
                pins[k] -= 1
                if not pins[k]:
                    del pins[k]
            store.check_integrity()
            assert list(store.index) == list(model)
            for k, v in model.items():
                assert torch.equal(store.rows[store.index[k]], torch.full((3,), v))
            a = store.alloc
            assert a.num_in_use == len(pins) and a.num_evictable == len(model) - len(pins)


def test_host_pool_splits_its_budget_like_l1():
    pool = HostPool(1000, {"f": 10, "s": 40}, {"f": 2, "s": 8}, {"f": 300, "s": 100},
                    torch.float32)
    assert pool.stores["f"].alloc.capacity == 75 and pool.stores["s"].alloc.capacity == 6
    pool.check_integrity()
