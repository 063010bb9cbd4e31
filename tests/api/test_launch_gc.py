"""Serving starts with start-up's objects frozen out of the garbage collector's scans."""
import gc

from mimo.api.launch import freeze_startup_objects


def test_freeze_moves_live_objects_out_of_collection():
    gc.unfreeze()
    keep = [[i] for i in range(1000)]            # long-lived start-up objects
    before = gc.get_freeze_count()
    freeze_startup_objects()
    try:
        assert gc.get_freeze_count() >= before + len(keep)
        assert all(gc.is_tracked(x) for x in keep[:3])
    finally:
        gc.unfreeze()
