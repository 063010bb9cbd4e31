"""examples/image_embeddings.py composes the media stages and the batched encoder into a
pipeline of its own: one embedding per image of a folder, the encoder batching across
images (fewer forwards than images)."""
import os
import shutil
import subprocess
import sys

from helpers.media import media_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_embeds_a_folder_of_images(tmp_path):
    names = ["astronaut.png", "coffee.png", "rocket.jpg"]
    for n in names:
        shutil.copy(media_path(n), tmp_path / n)
    shutil.copy(media_path("rocket.jpg"), tmp_path / "rocket_again.jpg")   # same bytes
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ROOT}
    p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "image_embeddings.py"),
                        str(tmp_path)], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines[:4]] == sorted(names + ["rocket_again.jpg"])
    rows = {ln.split()[0]: [float(x) for x in ln.split()[1:]] for ln in lines[5:9]}
    # Identical bytes: identical embeddings (cosine 1); the rest differ.
    assert abs(rows["rocket.jpg"][3] - 1.0) < 1e-5 and rows["rocket.jpg"][0] < 0.999
    n_images, forwards = int(lines[-1].split()[0]), int(lines[-1].split()[2])
    assert n_images == 4 and 1 <= forwards < 4
