"""examples/custom_pipeline.py runs with no model and no network and prints its results;
close() leaves no task behind; a broken BatchStage collector fails requests, never hangs."""
from __future__ import annotations

import asyncio
import pathlib
import subprocess
import sys

import pytest
from helpers.pipeline import Job, async_test

from mimo.pipeline import BatchStage, Pipeline, PipelineClosed, Request, StageError

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_example_runs_and_prints_results(tmp_path):
    (tmp_path / "a.txt").write_text("rivers carry water to the sea")
    (tmp_path / "b.txt").write_text("the sea is fed by rivers and rain")
    (tmp_path / "c.txt").write_text("")
    out = subprocess.run([sys.executable, str(ROOT / "examples/custom_pipeline.py"),
                          str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "embedded 3 files" in text
    assert "c.txt        error   InvalidRequest: [embed] empty document" in text
    assert "a.txt        -> b.txt" in text
    assert "streaming a.txt: RIVERS CARRY WATER TO THE SEA" in text

    default = subprocess.run([sys.executable, str(ROOT / "examples/custom_pipeline.py")],
                             capture_output=True, text=True, timeout=60)
    assert default.returncode == 0, default.stderr
    assert "is not UTF-8 text" in default.stdout and "streaming sea.txt:" in default.stdout


@async_test()
async def test_close_leaves_no_task_behind():
    class Echo(BatchStage):
        max_wait_ms = 1

        async def process_batch(self, reqs):
            for r in reqs:
                r.echo = r.x
            return [r.x for r in reqs]

    async def words(req):
        for i in range(req.echo):
            yield i

    before = asyncio.all_tasks()
    p = Pipeline([Echo(), words], max_in_flight=4)
    assert await asyncio.gather(*(p.run(Job(x=3)) for _ in range(8))) \
        == [[0, 1, 2]] * 8
    assert len(asyncio.all_tasks() - before) == 1          # the batch collector
    await p.close()
    assert asyncio.all_tasks() == before


@async_test()
async def test_a_broken_collector_fails_requests_instead_of_hanging():
    class Broken(BatchStage):
        def _take(self):
            raise RuntimeError("bug in the collector")

        async def process_batch(self, reqs):
            return [1] * len(reqs)

    b = Broken()
    with pytest.raises(StageError, match="bug in the collector"):
        await b.run(Request())
    with pytest.raises(PipelineClosed):
        await b.run(Request())
    await b.close()
