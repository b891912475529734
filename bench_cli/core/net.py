"""Network checks that answer in seconds: a machine without network must get a clear message or
an offline fallback at once, not minutes of retries."""
from __future__ import annotations

import socket
from urllib.parse import urlparse


def reachable(url: str, timeout: float = 3.0) -> bool:
    """Whether a TCP connection to ``url``'s host opens within ``timeout`` seconds."""
    u = urlparse(url)
    try:
        socket.create_connection((u.hostname, u.port or (443 if u.scheme == "https" else 80)), timeout=timeout).close()
        return True
    except OSError:
        return False
