"""Media URL fetching that cannot reach inside: every connection goes to an address checked first.

The check runs where the socket connects — for the first request and for every redirect — on the
very address connected to (no resolve-then-connect gap for DNS rebinding to slip through).
Loopback, private, link-local, shared (CGNAT), multicast, reserved and unspecified addresses are
refused, unless the URL's host is one the operator listed in allowed_media_domains.
"""

import http.client
import ipaddress
import socket
import urllib.request

from .errors import MediaError


def is_internal(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (ip.is_loopback or ip.is_private or ip.is_link_local or ip.is_multicast or ip.is_reserved
            or ip.is_unspecified or not ip.is_global)


def _guarded_connect(allowed_hosts: frozenset[str]):
    def create_connection(address, timeout=socket.getdefaulttimeout(), source_address=None):
        host, port = address
        if host.lower().rstrip(".") in allowed_hosts:
            return socket.create_connection(address, timeout, source_address)
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as e:
            raise MediaError(f"cannot resolve media host {host!r}: {e.strerror}") from None
        last_error = None
        for family, kind, proto, _, sockaddr in infos:
            if is_internal(sockaddr[0]):
                raise MediaError(f"media URL host {host!r} resolves to a non-public address; refused "
                                 f"(list the host in --allowed-media-domains to allow it)")
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(timeout)
                sock.connect(sockaddr)
                return sock
            except OSError as e:
                sock.close()
                last_error = e
        raise OSError(f"could not connect to {host!r}: {last_error}")
    return create_connection


def guarded_opener(allowed_hosts: frozenset[str], redirect_handler) -> urllib.request.OpenerDirector:
    connect = _guarded_connect(allowed_hosts)

    class HTTPConnection(http.client.HTTPConnection):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._create_connection = connect

    class HTTPSConnection(http.client.HTTPSConnection):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._create_connection = connect

    class HTTPHandler(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(HTTPConnection, req)

    class HTTPSHandler(urllib.request.HTTPSHandler):
        def https_open(self, req):
            return self.do_open(HTTPSConnection, req, context=self._context)

    # no ProxyHandler: a proxy from the environment would connect on our behalf, unchecked
    opener = urllib.request.OpenerDirector()
    for handler in (HTTPHandler(), HTTPSHandler(), redirect_handler, urllib.request.HTTPDefaultErrorHandler(),
                    urllib.request.HTTPErrorProcessor()):
        opener.add_handler(handler)
    return opener
