"""The chat page's routes and flag, without a browser or a model: `/` and `/ui/*` serve the
package's static files with a policy that keeps the page on this server; `--no-web-ui` makes
`/` a 404 in OpenAI's error shape. (tests/api/test_web_ui_browser.py drives the page.)"""
from __future__ import annotations

import re
from pathlib import Path
from unittest.mock import MagicMock

import pytest
from starlette.testclient import TestClient

from mimo.api.app import build_app
from mimo.config import ServerConfig

STATIC = Path(__file__).resolve().parents[2] / "mimo" / "api" / "static"


def _client(**cfg) -> TestClient:
    # The page's routes need no engine: a stand-in server whose endpoints are never called.
    server = MagicMock()
    server.cfg = ServerConfig(**cfg)
    server.extra_routes = []
    return TestClient(build_app(server))


@pytest.mark.parametrize("path,name,kind", [("/", "index.html", "text/html"),
                                            ("/ui/app.js", "app.js", "text/javascript"),
                                            ("/ui/style.css", "style.css", "text/css")])
def test_page_files_served_by_default(path, name, kind):
    r = _client().get(path)
    assert r.status_code == 200
    assert r.content == (STATIC / name).read_bytes()
    assert r.headers["content-type"].startswith(kind)
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert "script-src 'self'" in csp      # no inline or foreign script


def test_no_web_ui_flag_makes_root_404():
    c = _client(web_ui=False)
    for path in ("/", "/ui/app.js"):
        r = c.get(path)
        assert r.status_code == 404
        assert r.json()["error"]["code"] == "not_found"


def test_help_documents_the_flag_and_it_parses():
    import server
    p = server.build_parser()
    assert "--no-web-ui" in p.format_help()
    from mimo.flags import server_config
    assert server_config(p.parse_args([])).web_ui is True
    assert server_config(p.parse_args(["--no-web-ui"])).web_ui is False


def test_page_loads_nothing_from_elsewhere_and_stays_small():
    names = sorted(f.name for f in STATIC.iterdir())
    assert names == ["app.js", "index.html", "style.css"]
    html = (STATIC / "index.html").read_text()
    assert set(re.findall(r'(?:src|href)="([^"]*)"', html)) == {
        "/ui/style.css", "/ui/app.js", "data:,"}
    for name in names:
        text = (STATIC / name).read_text()
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", text), name
        assert "@import" not in text and "innerHTML" not in text, name
        assert len(text.splitlines()) <= 300, name
