"""video-decode bench: the CLI runs end to end on a tiny generated video, JSON last."""
from __future__ import annotations

import json

from mimo.bench.__main__ import main


def test_cli_prints_one_json_line_last(tmp_path, capsys):
    assert main(["video-decode", "--workers", "1,2", "--seconds", "2", "--size", "160x96",
                 "--gop", "10", "--rounds", "1", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    res = json.loads(out[-1])
    assert res["source"] == {"width": 160, "height": 96, "fps": 30.0, "frames": 60}
    assert res["sampled_frames"] == 4                   # 2 s x 2 fps
    assert set(res["median_s"]) == set(res["speedup"]) == set(res["control_speedup"]) == {"1", "2"}
    assert set(res["cores_busy"]) == {"1", "2"}
    assert res["speedup"]["1"] == 1.0
    # Generated once, then reused from the cache directory.
    assert len(list(tmp_path.glob("*.mp4"))) == 1
    assert main(["video-decode", "--workers", "1", "--seconds", "2", "--size", "160x96",
                 "--gop", "10", "--rounds", "1", "--cache-dir", str(tmp_path)]) == 0
