"""``--web.listen-address``: ``[host]:port`` as Go's ``net.Listen`` reads it.

``:19464`` is every interface, IPv4 and IPv6; ``0.0.0.0:19464`` or ``exporter.local:19464``
one IPv4 address or host name; ``[::1]:19464`` an IPv6 address, in brackets.

Example::

    >>> parse_listen_address(":19464"), parse_listen_address("[::1]:0")
    (('', 19464), ('::1', 0))
    >>> format_listen_address("::", 19464)
    '[::]:19464'
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final

# A host name as Go's resolver accepts it: labels of letters, digits and hyphens.
_HOST_NAME: Final = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?"
)
_MAX_LENGTH: Final = 300


def parse_listen_address(text: str) -> tuple[str, int]:
    """``[host]:port`` into ``(host, port)``; ``host`` is ``""`` for every interface.

    Raises ``ValueError`` with a message that says what is wrong and shows the forms.
    """
    shown = text if len(text) <= 60 else text[:57] + "..."
    if len(text) > _MAX_LENGTH:
        raise ValueError(f"{shown!r} is too long for a listen address")
    host, sep, port_text = text.rpartition(":")
    if not sep:
        raise ValueError(
            f"{shown!r} has no port: write host:port, :port (every interface) or [v6]:port"
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            if ipaddress.ip_address(host).version != 6:
                raise ValueError
        except ValueError:
            raise ValueError(f"{shown!r}: [{host}] is not an IPv6 address") from None
    elif ":" in host:
        raise ValueError(f"{shown!r}: an IPv6 address goes in brackets, e.g. [::1]:19464")
    elif host:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if not _HOST_NAME.fullmatch(host):
                raise ValueError(
                    f"{shown!r}: {host!r} is not an IP address or host name"
                ) from None
    if not port_text.isdigit() or len(port_text) > 5 or int(port_text) > 65535:
        raise ValueError(f"{shown!r}: the port must be a number from 0 to 65535")
    return host, int(port_text)


def format_listen_address(host: str, port: int) -> str:
    """``(host, port)`` back into ``[host]:port`` (brackets around IPv6)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
