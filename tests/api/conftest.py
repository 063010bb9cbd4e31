"""Fixtures: a real server process on 127.0.0.1 (a free port), driven by the official openai
client. What test modules import lives in helpers.api_server."""
import pytest
from helpers.api_server import API_KEY, ServerProcess, vlm_server_process


@pytest.fixture(scope="session")
def server():
    # float32: numerics independent of batch composition, so results can be compared with
    # the offline API token for token.
    s = ServerProcess("--dtype", "float32", "--quantize", "none", "--kv-cache-memory", "256MiB",
                      "--api-key", API_KEY)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI
    return OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def spec_server():
    """The same server with n-gram speculative decoding."""
    s = ServerProcess("--dtype", "float32", "--quantize", "none", "--kv-cache-memory", "256MiB",
                      "--api-key", API_KEY,
                      "--speculative", "ngram", "--num-draft-tokens", "4")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def spec_client(spec_server):
    from openai import OpenAI
    return OpenAI(base_url=spec_server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture
def aclient(server):
    """A factory: an AsyncOpenAI client must be made inside the event loop that uses it."""
    from openai import AsyncOpenAI
    return lambda: AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0,
                               timeout=300)


# ---- a vision-language model (tiny Qwen2.5-VL) behind the real server ----------------------
@pytest.fixture(scope="session")
def vlm_dir(tmp_path_factory):
    from mimo.models.tiny import qwen2_5_vl
    d = tmp_path_factory.mktemp("tiny_qwen2_5_vl")
    qwen2_5_vl.write(d, seed=3)
    return d


@pytest.fixture(scope="session")
def media_dir():
    from helpers.media import MEDIA_DIR, media_path
    for name in ("astronaut.png", "coffee.png", "rocket.jpg", "nasa_13013.mp4"):
        media_path(name)          # fails, naming the missing file, when the set is absent
    return MEDIA_DIR


@pytest.fixture(scope="session")
def vlm_server(vlm_dir, media_dir):
    """May fetch from loopback (the test HTTP server): --allow-private-media-urls."""
    s = vlm_server_process(vlm_dir, media_dir, "--allow-private-media-urls")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def vlm_strict_server(vlm_dir, media_dir):
    """The default policy: no private addresses."""
    s = vlm_server_process(vlm_dir, media_dir)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def vlm_client(vlm_server):
    from openai import OpenAI
    return OpenAI(base_url=vlm_server.url + "/v1", api_key="none", max_retries=0, timeout=300)
