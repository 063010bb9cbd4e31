"""MediaConfig: frozen, unknown options and bad values rejected."""
from __future__ import annotations

import dataclasses

import pytest

from mimo.config import ConfigError
from mimo.multimodal.config import MediaConfig


def test_from_dict_and_validation():
    cfg = MediaConfig.from_dict({"max_bytes": 1024, "allowed_media_dirs": ["/srv/media"]})
    assert cfg.max_bytes == 1024 and cfg.allowed_media_dirs == ("/srv/media",)
    assert MediaConfig(allowed_media_dirs="/srv/media").allowed_media_dirs == ("/srv/media",)
    with pytest.raises(ConfigError, match="unknown MediaConfig option.*max_byte"):
        MediaConfig.from_dict({"max_byte": 1})
    for bad in ({"max_bytes": 0}, {"timeout_s": -1}, {"max_redirects": -1},
                {"video_min_frames": 10, "video_max_frames": 4}, {"decode_workers": 0}):
        with pytest.raises(ConfigError):
            MediaConfig(**bad)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_bytes = 5   # type: ignore[misc]
    # Safe defaults for a public server.
    d = MediaConfig()
    assert d.allow_private is False and d.allowed_media_dirs == ()
