"""HTTPS (vLLM's --ssl-keyfile, --ssl-certfile, --ssl-ca-certs, --ssl-cert-reqs) with
certificates openssl makes for the test: the server answers over TLS and not in plain text;
with ssl_cert_reqs 2 only a client holding a certificate ssl_ca_certs signs gets in; settings
that do not fit, and files that do not load, are refused naming the setting."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from troupe.config import ConfigError
from troupe.gateway.settings import add_settings_arguments, settings_from_args
from troupe.gateway.state import GatewaySettings
from troupe.gateway.tls import server_ssl_context

from tests.gateway.conftest import ServerThread

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def _self_signed(folder: Path, name: str, subject: str, extra: tuple[str, ...] = ()) -> None:
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-keyout", str(folder / f"{name}.key"), "-out", str(folder / f"{name}.crt"),
         "-subj", subject, *extra],
        check=True, capture_output=True,
    )  # fmt: skip


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("certs")
    _self_signed(folder, "server", "/CN=127.0.0.1", ("-addext", "subjectAltName=IP:127.0.0.1"))
    _self_signed(folder, "client", "/CN=a client")  # its own CA: ssl_ca_certs names it
    return folder


def _https(certs: Path, *, with_client_cert: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs / "server.crt"))
    if with_client_cert:
        context.load_cert_chain(str(certs / "client.crt"), str(certs / "client.key"))
    return context


def _get(url: str, context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=30, context=context) as resp:
        return resp.status, resp.read()


def _tls(certs: Path, **more: object) -> GatewaySettings:
    return GatewaySettings(
        ssl_keyfile=str(certs / "server.key"), ssl_certfile=str(certs / "server.crt"), **more
    )


def test_the_server_answers_over_tls_only(server: ServerThread, certs: Path) -> None:
    url = server.add_gateway(_tls(certs)).replace("http://", "https://")
    status, body = _get(f"{url}/health", _https(certs))
    assert status == 200 and json.loads(body)["status"] == "ok"
    request = urllib.request.Request(
        f"{url}/v1/completions",
        json.dumps({"prompt": "hello", "max_tokens": 3, "ignore_eos": True}).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30, context=_https(certs)) as resp:
        assert json.loads(resp.read())["usage"]["completion_tokens"] == 3
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        _get(url.replace("https://", "http://") + "/health")  # plain HTTP: no answer


def test_mutual_tls_needs_a_signed_client(server: ServerThread, certs: Path) -> None:
    settings = _tls(certs, ssl_ca_certs=str(certs / "client.crt"), ssl_cert_reqs=2)
    url = server.add_gateway(settings).replace("http://", "https://")
    assert _get(f"{url}/health", _https(certs, with_client_cert=True))[0] == 200
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError, OSError)):
        _get(f"{url}/health", _https(certs))  # no certificate: the handshake fails


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"ssl_keyfile": "k.pem"}, "ssl_keyfile and ssl_certfile"),
        ({"ssl_ca_certs": "ca.pem"}, "ssl_ca_certs"),
        ({"ssl_cert_reqs": 3}, "ssl_cert_reqs"),
    ],
)
def test_settings_that_do_not_fit_are_named(fields: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        GatewaySettings(**fields)  # type: ignore[arg-type]


def test_a_file_that_does_not_load_is_named(certs: Path) -> None:
    with pytest.raises(ConfigError, match="ssl_certfile / ssl_keyfile"):
        server_ssl_context(
            GatewaySettings(ssl_keyfile=str(certs / "client.key"), ssl_certfile="/nonexistent")
        )
    bad_ca = _tls(certs, ssl_ca_certs="/nonexistent", ssl_cert_reqs=1)
    with pytest.raises(ConfigError, match="ssl_ca_certs"):
        server_ssl_context(bad_ca)


def test_the_flags(certs: Path) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)
    key, cert, ca = (str(certs / n) for n in ("server.key", "server.crt", "client.crt"))
    argv = ["--ssl-keyfile", key, "--ssl-certfile", cert, "--ssl-ca-certs", ca]
    settings = settings_from_args(parser.parse_args([*argv, "--ssl-cert-reqs", "2"]))
    assert (settings.ssl_keyfile, settings.ssl_cert_reqs) == (key, 2)
    assert server_ssl_context(settings) is not None
