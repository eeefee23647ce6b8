"""Which hosts a model's ``baseUrl`` may name (``AIGCQ_ASYNCH_MODEL_HOSTS``).

The allow-list is comma-separated: an exact host name or address, ``*.example.com`` (any
host under it), or a network in CIDR form (``10.0.0.0/8``). Unset, any host is allowed but
link-local addresses (``169.254.0.0/16``, ``fe80::/10``: where cloud metadata services answer).
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from aigcq.asynch.errors import AsynchError, Code

IP = ipaddress.IPv4Address | ipaddress.IPv6Address


def _address(host: str) -> IP | None:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def check_model_host(url: str, allowed: str) -> None:
    """Refuse (``MODEL_HOST_NOT_ALLOWED``) a ``baseUrl`` whose host the settings do not allow."""
    host = (urlsplit(url).hostname or "").lower()
    ip = _address(host)
    patterns = [p.strip().lower() for p in allowed.split(",") if p.strip()]
    if not patterns:
        if ip is not None and ip.is_link_local:
            raise AsynchError(
                Code.MODEL_HOST_NOT_ALLOWED,
                f"baseUrl: {host} is a link-local address; list it in AIGCQ_ASYNCH_MODEL_HOSTS"
                " to allow it",
            )
        return
    for pattern in patterns:
        if "/" in pattern:
            try:
                if ip is not None and ip in ipaddress.ip_network(pattern, strict=False):
                    return
            except ValueError:
                continue
        elif (pattern.startswith("*.") and host.endswith(pattern[1:])) or host == pattern.strip(
            "[]"
        ):
            return
    raise AsynchError(
        Code.MODEL_HOST_NOT_ALLOWED, f"baseUrl: host {host!r} is not in AIGCQ_ASYNCH_MODEL_HOSTS"
    )
