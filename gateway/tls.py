"""HTTPS for `troupe serve` (vLLM's --ssl-keyfile, --ssl-certfile, --ssl-ca-certs and
--ssl-cert-reqs): the listening socket wraps each connection in TLS; everything above it (the
connection gate, HTTP, websockets) is unchanged. `ssl_cert_reqs` asks clients for a
certificate signed by `ssl_ca_certs`: 0 never, 1 if they have one, 2 always (mutual TLS).
A file that cannot be loaded stops the start with one line naming the setting."""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

from troupe.config import ConfigError

if TYPE_CHECKING:
    from troupe.gateway.settings import GatewaySettings

CERT_REQS = {0: ssl.CERT_NONE, 1: ssl.CERT_OPTIONAL, 2: ssl.CERT_REQUIRED}


def check_tls(settings: GatewaySettings) -> None:
    """ConfigError naming the TLS setting that does not fit the others."""
    if (settings.ssl_keyfile is None) != (settings.ssl_certfile is None):
        raise ConfigError("ssl_keyfile and ssl_certfile go together: give both, or neither")
    if settings.ssl_cert_reqs not in CERT_REQS:
        raise ConfigError(
            f"ssl_cert_reqs must be 0 (none), 1 (optional) or 2 (required), got "
            f"{settings.ssl_cert_reqs!r}"
        )
    if settings.ssl_certfile is None and settings.ssl_ca_certs is not None:
        raise ConfigError("ssl_ca_certs needs ssl_certfile and ssl_keyfile: HTTPS is off")
    if settings.ssl_cert_reqs and settings.ssl_ca_certs is None:
        raise ConfigError(
            "ssl_cert_reqs asks clients for certificates: give ssl_ca_certs to check them"
        )


def server_ssl_context(settings: GatewaySettings) -> ssl.SSLContext | None:
    """The listening socket's TLS context (None: plain HTTP)."""
    if settings.ssl_certfile is None or settings.ssl_keyfile is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(settings.ssl_certfile, settings.ssl_keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"ssl_certfile / ssl_keyfile: cannot load {settings.ssl_certfile!r} with "
            f"{settings.ssl_keyfile!r}: {exc}"
        ) from None
    if settings.ssl_ca_certs is not None:
        try:
            context.load_verify_locations(cafile=settings.ssl_ca_certs)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"ssl_ca_certs: cannot load {settings.ssl_ca_certs!r}: {exc}"
            ) from None
    context.verify_mode = CERT_REQS[settings.ssl_cert_reqs]
    return context
