"""The server's listening sockets, bound before the model is loaded: a port that is taken (or
not this machine's to bind) is one line at once, naming the port or host and how to choose
another, instead of a server that says it serves and then fails to bind."""

import errno
import socket

BACKLOG = 2048  # uvicorn's default, which it sets again when it serves the sockets


class CannotListen(Exception):
    """The address cannot be bound; the message is the one line to print."""


def bound_sockets(host: str, port: int) -> list[socket.socket]:
    """Sockets bound to every address of `host` at `port` (as asyncio's create_server binds
    them) and listening, so that the port is held from here on (a socket bound but not
    listening does not keep another SO_REUSEADDR server off it): a connection made while the
    model loads waits in the backlog until the server accepts it."""
    choose_port = f"choose another with --port (make serve PORT={_other(port)})"
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError):
        raise CannotListen(f"host {host!r} is not a name or address this machine knows; choose "
                           "another with --host (make serve HOST=127.0.0.1)") from None
    bound = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(
                (a[0], a[1], a[2], None, a[4]) for a in addresses):
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(BACKLOG)
    except OSError as error:
        for sock in bound:
            sock.close()
        if error.errno == errno.EADDRINUSE:
            raise CannotListen(f"port {port} on {host} is already in use (another server, or "
                               f"make ui); {choose_port}") from None
        if error.errno == errno.EACCES:
            raise CannotListen(f"port {port} on {host}: permission denied (ports below 1024 "
                               f"need privileges); {choose_port}") from None
        if error.errno == errno.EADDRNOTAVAIL:
            raise CannotListen(f"host {host} is not an address of this machine; choose another "
                               "with --host (make serve HOST=127.0.0.1)") from None
        raise CannotListen(f"cannot listen on {host}:{port}: {error.strerror}") from None
    return bound


def _other(port: int) -> int:
    return port + 1 if port < 65535 else 5001
