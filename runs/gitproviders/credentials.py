"""A provider's token goes only to that provider's configured hosts.

The clone URL is the tenant's; the token is the operator's. So the token is attached to
git's requests only when the clone URL's origin (scheme, host, port) is one of the
provider's configured git origins (``GITHUB_GIT_HOSTS`` / ``GITLAB_GIT_HOSTS``, by
default derived from the provider's API URL: ``github.com`` for api.github.com, the
API's own host for GitHub Enterprise and GitLab), and then only as git configuration
scoped to that origin (``http.<origin>/.extraHeader``), with redirects off
(``runs.agent.platform_git``). REST clients carry the token through an ``httpx.Auth``
that adds it only to requests for the configured API origin.
"""

from __future__ import annotations

import base64
from collections.abc import Generator
from dataclasses import dataclass
from urllib.parse import urlparse

import httpx
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from runs.git_network import DEFAULT_PORTS, endpoint_of


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str
    port: int

    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = DEFAULT_PORTS.get(self.scheme)
        return f"{self.scheme}://{host}{'' if self.port == default else f':{self.port}'}"


def origin_parse(entry: str) -> Origin:
    """``https://host[:port]``, ``http://host:port`` or a bare ``host[:port]`` (https)."""
    entry = entry.strip().rstrip("/")
    parsed = urlparse(entry if "://" in entry else f"https://{entry}")
    scheme = parsed.scheme.lower()
    if scheme not in ("https", "http") or not parsed.hostname:
        raise ValueError(f"{entry!r} is not an http(s) origin")
    return Origin(scheme, parsed.hostname.lower(), parsed.port or DEFAULT_PORTS[scheme])


def _api_origin(api_url: str) -> Origin:
    parsed = urlparse(api_url)
    return origin_parse(f"{parsed.scheme}://{parsed.netloc}")


def provider_git_origins(provider: str) -> list[Origin]:
    """The origins a provider's token may be sent to by git."""
    if provider == "github":
        configured, api_url = settings.GITHUB_GIT_HOSTS, settings.GITHUB_API_URL
    elif provider == "gitlab":
        configured, api_url = settings.GITLAB_GIT_HOSTS, settings.GITLAB_API_URL
    else:
        return []
    if configured:
        try:
            return [origin_parse(entry) for entry in configured if entry]
        except ValueError as exc:
            raise ImproperlyConfigured(
                f"Invalid value for {provider.upper()}_GIT_HOSTS: {exc}"
            ) from exc
    api = _api_origin(api_url)
    if api.host == "api.github.com":
        return [Origin("https", "github.com", 443)]
    return [api]


def url_origin(url: str) -> Origin | None:
    """The http(s) origin of a clone URL; None for ssh, paths and anything else."""
    endpoint = endpoint_of(url)
    if endpoint is None or endpoint.scheme not in ("https", "http"):
        return None
    return Origin(endpoint.scheme, endpoint.host.strip("[]"), endpoint.port)


def git_basic_credentials(
    *, provider: str, url: str, username: str, token: str
) -> tuple[dict[str, str], str]:
    """Git config that sends ``token`` as HTTP basic auth to ``url``, and the secret to
    redact from errors; nothing unless ``url`` is on one of the provider's origins."""
    if not token:
        return {}, ""
    origin = url_origin(url)
    if origin is None or origin not in provider_git_origins(provider):
        return {}, ""
    basic = base64.b64encode(f"{username}:{token}".encode()).decode()
    # Scoped by git itself too: were the URL rewritten on the way, git would not send it.
    return {f"http.{origin.url()}/.extraHeader": f"Authorization: Basic {basic}"}, basic


class OriginScopedAuth(httpx.Auth):
    """Adds ``header: value`` to requests for ``api_url``'s origin, and to no other."""

    def __init__(self, *, api_url: str, header: str, value: str) -> None:
        self.origin = _api_origin(api_url)
        self.header = header
        self.value = value

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        url = request.url
        port = url.port or DEFAULT_PORTS.get(url.scheme, 0)
        if Origin(url.scheme, url.host.lower(), port) == self.origin:
            request.headers[self.header] = self.value
        else:
            request.headers.pop(self.header, None)
        yield request
