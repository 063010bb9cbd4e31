"""A decode worker's allow-list of prefill workers (`--prefill-peer`): which x-mimo-prefill
URLs it follows, without processes (the HTTP 403 is checked on real workers in
test_pd_faults.py)."""
from __future__ import annotations

import pytest

from mimo.config import ConfigError, ServerConfig
from mimo.config.peers import normalize_peer, peer_allowed


def test_normalized_by_scheme_host_port_and_path():
    assert normalize_peer("http://127.0.0.1:8001/") == "http://127.0.0.1:8001"
    assert normalize_peer("HTTP://Prefill.Example:8001") == "http://prefill.example:8001"
    assert normalize_peer("https://p.example") == "https://p.example:443"
    assert normalize_peer("http://[::1]:9/x/") == "http://[::1]:9/x"
    for bad in ["ftp://p:1", "p:1", "http://", "http://u:pw@p:1", "http://p:1/?a=1",
                "http://p:1/#f", "http://p:99999"]:
        with pytest.raises(ValueError):
            normalize_peer(bad)


def test_default_allows_loopback_only():
    for ok in ["http://127.0.0.1:8001", "http://127.3.4.5:1", "http://localhost:8001",
               "http://[::1]:8001", "https://127.0.0.1"]:
        assert peer_allowed(ok, ()), ok
    for no in ["http://10.0.0.5:8001", "http://169.254.169.254/latest", "http://p.example:1",
               "http://0.0.0.0:8001", "file:///etc/passwd", "http://127.0.0.1.evil.example",
               "http://u@127.0.0.1:1", "not a url"]:
        assert not peer_allowed(no, ()), no


def test_allow_list_is_exact():
    peers = ServerConfig(role="decode", prefill_peers=("http://10.0.0.5:8001/",
                                                       "http://P2.example:80")).prefill_peers
    assert peers == ("http://10.0.0.5:8001", "http://p2.example:80")
    assert peer_allowed("http://10.0.0.5:8001", peers)
    assert peer_allowed("http://10.0.0.5:8001/", peers)
    assert peer_allowed("http://p2.example", peers)              # port 80 spelt out
    for no in ["http://10.0.0.5:8002", "https://10.0.0.5:8001", "http://10.0.0.6:8001",
               "http://127.0.0.1:8001", "http://10.0.0.5:8001/other"]:
        assert not peer_allowed(no, peers), no       # loopback too, once a list is given


def test_config_refuses_bad_peers_and_other_roles():
    with pytest.raises(ConfigError, match="prefill-peer"):
        ServerConfig(role="decode", prefill_peers=("ftp://x:1",))
    with pytest.raises(ConfigError, match="role decode"):
        ServerConfig(role="prefill", prefill_peers=("http://127.0.0.1:1",))
