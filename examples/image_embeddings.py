"""Compose mimo's own media stages into a pipeline of your own: embeddings for a folder of
images, no language model involved.

    python examples/image_embeddings.py FOLDER [--model QWEN2_5_VL_DIR]

Without --model it writes a tiny random Qwen2.5-VL checkpoint to a temporary directory (the
numbers are then meaningless; the plumbing is the real one). Each image is one request through

    fetch -> decode_media -> preprocess -> encode (BatchStage: one vision forward for many
    images, embedding cache in front) -> pool (a plain async function: mean of the merged
    patch embeddings)

all requests submitted at once, so decoding of later images overlaps the encoder forward of
earlier ones and the encoder batches across images. Prints one line per image, then the
cosine-similarity matrix and how many encoder forwards ran.
"""
from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # run from a checkout

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif"}


async def embed_folder(folder: pathlib.Path, model_dir: str) -> tuple[list, list, int]:
    import torch

    from mimo.models import registry
    from mimo.multimodal.adapter import adapter_for
    from mimo.multimodal.config import MediaConfig
    from mimo.multimodal.embed_cache import EmbedCache
    from mimo.multimodal.item import MediaItem
    from mimo.pipeline import Pipeline
    from mimo.stages import ChatRequest, DecodeMedia, EncodeStage, Fetch, Preprocess

    loaded = registry.load(model_dir, progress=False)
    adapter = adapter_for(loaded.config)     # the vision family's settings and tower
    if adapter is None:
        raise SystemExit(f"{model_dir} has no vision tower")
    model = registry.build_model(loaded.config, loaded.weights, torch.float32).eval()
    media = MediaConfig(allowed_media_dirs=(str(folder.resolve()),))

    async def pool(req):
        """Mean-pool each item's merged patch embeddings into one vector."""
        return [e.mean(dim=0) for e in req.embeds]

    encode = EncodeStage(adapter.encoder(model), patch_dim=adapter.patch_dim,
                         merge=adapter.merge, cache=EmbedCache(256 << 20))
    settings = adapter.processor_settings(media)
    pipe = Pipeline([Fetch(media), DecodeMedia(media), Preprocess(settings),
                     encode, pool], name="image-embeddings")
    paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not paths:
        raise SystemExit(f"no images in {folder}")
    try:
        reqs = [ChatRequest(media=[MediaItem("image", str(p.resolve()))]) for p in paths]
        outs = await asyncio.gather(*(pipe.run(r) for r in reqs))
    finally:
        await pipe.close()
    return paths, [o[0] for o in outs], encode.forwards


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=pathlib.Path)
    p.add_argument("--model", default=None, help="a Qwen2.5-VL checkpoint directory")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model
        if model is None:
            from mimo.models.tiny import qwen2_5_vl
            qwen2_5_vl.write(pathlib.Path(tmp), seed=0)
            model = tmp
        paths, vecs, forwards = asyncio.run(embed_folder(a.folder, model))
    import torch
    m = torch.stack(vecs)
    m = m / m.norm(dim=1, keepdim=True)
    for path, v in zip(paths, vecs):
        print(f"{path.name}: {v.shape[0]}-d, norm {float(v.norm()):.3f}")
    print("cosine similarity:")
    for path, row in zip(paths, m @ m.T):
        print(f"  {path.name:>24} " + " ".join(f"{float(x):+.3f}" for x in row))
    print(f"{len(paths)} images, {forwards} encoder forward(s)")


if __name__ == "__main__":
    main()
