"""Random JSON schemas (objects, arrays, enums, nesting, `required`) from one seed. Strings,
arrays and numbers are bounded, as OpenAI's strict mode and any finite answer need: a base
model may otherwise fill a string until max_tokens."""
from __future__ import annotations

import random

WORDS = ["alpha", "beta", "gamma", "red", "green", "blue", "north", "south", "cat", "dog"]


def _name(rng: random.Random, used: set) -> str:
    while True:
        n = rng.choice(["id", "name", "age", "tags", "score", "city", "kind", "size", "items",
                        "owner", "color", "valid", "count", "meta", "level"]) + (
            "" if rng.random() < 0.6 else f"_{rng.randrange(10)}")
        if n not in used:
            used.add(n)
            return n


def _leaf(rng: random.Random) -> dict:
    k = rng.randrange(6)
    if k == 0:
        return {"type": "string", "maxLength": rng.randint(1, 12)}
    if k == 1:
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 100)}
    if k == 2:
        return {"type": "boolean"}
    if k == 3:
        return {"enum": rng.sample(WORDS, rng.randint(1, 4))}
    if k == 4:
        return {"type": "string", "enum": rng.sample(WORDS, rng.randint(2, 5))}
    return {"type": "integer", "enum": rng.sample(range(100), 3)}


def _schema(rng: random.Random, depth: int) -> dict:
    r = rng.random()
    if depth < 2 and r < 0.25:
        return _object(rng, depth + 1)
    if depth < 2 and r < 0.45:
        lo = rng.randint(0, 2)
        return {"type": "array", "items": _schema(rng, depth + 1), "minItems": lo,
                "maxItems": lo + rng.randint(0, 3)}
    return _leaf(rng)


def _object(rng: random.Random, depth: int) -> dict:
    used: set = set()
    props = {_name(rng, used): _schema(rng, depth) for _ in range(rng.randint(1, 4))}
    req = [k for k in props if rng.random() < 0.7] or [next(iter(props))]
    return {"type": "object", "properties": props, "required": req,
            "additionalProperties": False}


def random_schemas(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [_object(rng, 0) for _ in range(n)]
