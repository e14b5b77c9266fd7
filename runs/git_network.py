"""Where the platform's git may connect, checked when it is about to connect.

A clone URL is written by a workspace admin, but the platform's git connects from the
worker's host, inside the platform's own network: a URL naming ``127.0.0.1``, a
private address, the cloud metadata service or a name that resolves to one of them
would make the worker talk to services no tenant may reach (and, before tokens were
scoped, hand them a provider token). So every network git operation resolves the host
right before it runs, refuses any address that is not on the public internet unless the
operator names it in ``GIT_INTERNAL_HOSTS`` / ``GIT_INTERNAL_NETWORKS``, and pins git to
the address it checked (curl's resolve list for http(s), ``HostName`` for ssh), so a
second DNS answer cannot swap in another address between the check and the connection.
Metadata services are refused whatever the allowlist says.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
import socket
from dataclasses import dataclass, field
from urllib.parse import urlparse

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# user@host:path, git's scp-like ssh syntax.
SCP_LIKE = re.compile(r"^(?:[A-Za-z0-9._-]+@)?(?P<host>[A-Za-z0-9.-]+):(?!//)(?P<path>.+)$")
DEFAULT_PORTS = {"https": 443, "http": 80, "ssh": 22}
# Schemes a network clone URL may ever use; which of them are on is configuration.
NETWORK_SCHEMES = frozenset(DEFAULT_PORTS)
# Instance metadata services (AWS, GCP and Azure on 169.254.169.254, AWS over IPv6,
# Azure's wire server, Alibaba, Oracle): they hand out the host's cloud credentials.
METADATA_NETWORKS = tuple(
    ipaddress.ip_network(n)
    for n in (
        "169.254.0.0/16",
        "fd00:ec2::254/128",
        "168.63.129.16/32",
        "100.100.100.200/32",
        "192.0.0.192/32",
    )
)
# ``[user@]host[:port]`` and nothing else: a backslash, a percent sign or a second "@"
# could make curl or ssh read another host out of the URL than the one checked here.
PLAIN_NETLOC = re.compile(
    r"(?:[A-Za-z0-9._~-]+@)?(?:[A-Za-z0-9][A-Za-z0-9.-]*|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?"
)
# IPv6 prefixes that carry an IPv4 address a gateway connects to (NAT64, 6to4).
NAT64 = ipaddress.ip_network("64:ff9b::/96")


class AddressRefused(ValueError):
    """The host of a clone URL may not be reached; the message says why."""


@dataclass(frozen=True)
class Endpoint:
    """The network end of a clone URL: ``scheme`` is https, http or ssh."""

    scheme: str
    host: str
    port: int


@dataclass
class Connection:
    """How to run one git process so that it reaches only the checked address."""

    protocol: str
    config: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


def endpoint_of(url: str) -> Endpoint | None:
    """The network endpoint ``url`` names, or None when it names no network host."""
    scp = SCP_LIKE.match(url)
    if scp and "://" not in url:
        return Endpoint("ssh", scp.group("host").lower(), DEFAULT_PORTS["ssh"])
    try:
        parsed = urlparse(url)
    except ValueError as exc:  # e.g. an unclosed "[" of an IPv6 address
        raise AddressRefused(f"the clone URL does not parse: {exc}") from exc
    scheme = parsed.scheme.lower()
    if scheme not in NETWORK_SCHEMES or not parsed.hostname:
        return None
    if not PLAIN_NETLOC.fullmatch(parsed.netloc) or any(c in url for c in "\\\r\n\t "):
        raise AddressRefused("the clone URL's host part must be a plain [user@]host[:port]")
    try:
        port = parsed.port or DEFAULT_PORTS[scheme]
    except ValueError as exc:
        raise AddressRefused(f"the clone URL's port is not a number: {exc}") from exc
    return Endpoint(scheme, parsed.hostname.lower(), port)


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_kind(address: IPAddress) -> str:
    """What kind of non-public address ``address`` is; "" for a public one."""
    if any(address in network for network in METADATA_NETWORKS):
        return "metadata service"
    inner = _embedded_ipv4(address)
    if inner is not None:
        return address_kind(inner)
    for kind, flag in (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("private", address.is_private),
        ("reserved", address.is_reserved),
    ):
        if flag:
            return kind
    return "" if address.is_global else "non-global"


def _internal_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    try:
        return [ipaddress.ip_network(n, strict=False) for n in settings.GIT_INTERNAL_NETWORKS if n]
    except ValueError as exc:
        raise ImproperlyConfigured(f"Invalid value for GIT_INTERNAL_NETWORKS: {exc}") from exc


def allowed_schemes() -> set[str]:
    """``GIT_ALLOWED_SCHEMES``, of which only https, http and ssh can ever be allowed."""
    schemes = {s.strip().lower() for s in settings.GIT_ALLOWED_SCHEMES if s.strip()}
    if schemes - NETWORK_SCHEMES:
        raise ImproperlyConfigured(
            f"Invalid value for GIT_ALLOWED_SCHEMES: {sorted(schemes - NETWORK_SCHEMES)} "
            f"(only {', '.join(sorted(NETWORK_SCHEMES))})"
        )
    return schemes


def _host_internal(host: str) -> bool:
    return host.strip("[]").lower() in {h.strip("[]").lower() for h in settings.GIT_INTERNAL_HOSTS}


def _refusal(host: str, address: IPAddress) -> str:
    """Why ``host`` may not be reached at ``address``; "" when it may."""
    kind = address_kind(address)
    if not kind:
        return ""
    metadata = kind == "metadata service"
    if not metadata and (_host_internal(host) or any(address in n for n in _internal_networks())):
        return ""
    named = f"{host!r} resolves to {address}" if host.strip("[]") != str(address) else f"{host!r}"
    inside = " (an IPv4 address inside an IPv6 one)" if _embedded_ipv4(address) else ""
    allow = (
        ""
        if metadata
        else " unless the operator allows it (GIT_INTERNAL_HOSTS / GIT_INTERNAL_NETWORKS)"
    )
    return (
        f"{named}, a {kind} address{inside}: clone URLs may not reach the platform's own "
        f"network{allow}"
    )


def _resolve(endpoint: Endpoint) -> list[IPAddress]:
    infos = socket.getaddrinfo(endpoint.host.strip("[]"), endpoint.port, type=socket.SOCK_STREAM)
    addresses: list[IPAddress] = []
    for info in infos:
        # A scoped IPv6 address ("fe80::1%eth0") names the scope after "%".
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    return addresses


def endpoint_check(endpoint: Endpoint, *, unresolved_ok: bool = False) -> list[IPAddress]:
    """The addresses ``endpoint``'s host resolves to now, all of them allowed.

    Every address must be allowed, not just the first: a name answering with a public
    and a loopback address would otherwise let git pick the loopback one. A host that
    does not resolve is refused unless ``unresolved_ok`` (registration: the name may
    not exist yet, and every use checks again).
    """
    try:
        addresses = _resolve(endpoint)
    except (socket.gaierror, UnicodeError) as exc:
        if unresolved_ok:
            return []
        raise AddressRefused(f"the host {endpoint.host!r} does not resolve: {exc}") from exc
    if not addresses:
        raise AddressRefused(f"the host {endpoint.host!r} has no address")
    for address in addresses:
        reason = _refusal(endpoint.host, address)
        if reason:
            raise AddressRefused(reason)
    return addresses


def _ssh_command(endpoint: Endpoint, address: IPAddress | None) -> str:
    timeout = max(1, int(settings.GIT_NETWORK_TIMEOUT_SECONDS))
    options = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={min(timeout, 30)}"]
    if address is not None:
        # Connect to the checked address; the host key is still looked up by name.
        options += ["-o", f"HostName={address}", "-o", f"HostKeyAlias={endpoint.host}"]
    return shlex.join(["ssh", *options])


def connection_for(url: str) -> Connection:
    """How git may reach ``url`` now: the host resolved and checked, the connection
    pinned to the checked address, only ``url``'s own protocol allowed.

    A URL that names no network host (a path, ``file://``) gets the ``file`` protocol
    only; whether such a path may be used at all is ``runs.repositories``' rule.
    """
    endpoint = endpoint_of(url)
    if endpoint is None:
        return Connection(protocol="file")
    if endpoint.scheme not in allowed_schemes():
        raise AddressRefused(f"{endpoint.scheme} is not in GIT_ALLOWED_SCHEMES")
    addresses = endpoint_check(endpoint)
    literal = _literal(endpoint.host)
    pinned = None if literal is not None else addresses[0]
    if endpoint.scheme == "ssh":
        return Connection(protocol="ssh", env={"GIT_SSH_COMMAND": _ssh_command(endpoint, pinned)})
    config = {}
    if pinned is not None:
        shown = f"[{pinned}]" if pinned.version == 6 else str(pinned)
        config["http.curloptResolve"] = f"{endpoint.host}:{endpoint.port}:{shown}"
    return Connection(protocol=endpoint.scheme, config=config)


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
