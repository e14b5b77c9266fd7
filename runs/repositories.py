"""Which clone URLs a repository may have.

A clone URL decides what the platform's own git reads, with the platform's file
permissions and from the platform's network: a workspace admin who could point it at a
path on the platform's disk (another tenant's repository, the platform's own files) or
at an address inside the platform's network (its database, Redis, the cloud metadata
service) would read or probe it. So: workspace admins register ``https`` URLs (``ssh``
when the operator lists it in ``GIT_ALLOWED_SCHEMES``); plain ``http`` is for staff and
only when listed; local paths and ``file://`` URLs are for staff, and only under
``LOCAL_REPOSITORY_ROOTS``; the host must not resolve to a loopback, private,
link-local or metadata address unless the operator allows it (``runs.git_network``); an
optional ``REPOSITORY_HOST_ALLOWLIST`` limits the hosts; credentials never go in the URL
(they would be stored in a ``.git/config``). The same rules (minus the staff ones) are
checked again before every clone and push, the address right before git connects.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

from django.conf import settings

from runs.git_network import (
    SCP_LIKE,
    AddressRefused,
    allowed_schemes,
    endpoint_check,
    endpoint_of,
)

# Plain http carries no integrity: only an operator may choose it for a mirror.
STAFF_ONLY_SCHEMES = frozenset({"http"})


class CloneUrlRefused(ValueError):
    """The clone URL breaks the registration rules; the message says which."""


def _local_path(clone_url: str) -> Path | None:
    """The path a local clone URL names, or None for a remote URL."""
    if clone_url.startswith("file://"):
        return Path(urlparse(clone_url).path)
    if "://" in clone_url or SCP_LIKE.match(clone_url):
        return None
    return Path(clone_url)


def local_roots() -> list[Path]:
    return [Path(os.path.realpath(root)) for root in settings.LOCAL_REPOSITORY_ROOTS if root]


def _check_local(path: Path) -> str:
    if not path.is_absolute():
        raise CloneUrlRefused("a local repository must be given by an absolute path")
    resolved = Path(os.path.realpath(path))
    roots = local_roots()
    if not any(resolved == root or root in resolved.parents for root in roots):
        where = ", ".join(str(r) for r in roots) or "none are configured"
        raise CloneUrlRefused(f"local repositories must be under LOCAL_REPOSITORY_ROOTS ({where})")
    return str(resolved)


def _schemes_allowed(staff: bool) -> list[str]:
    return sorted(s for s in allowed_schemes() if staff or s not in STAFF_ONLY_SCHEMES)


def _check_remote(clone_url: str, *, staff: bool, resolve: bool) -> None:
    scp = SCP_LIKE.match(clone_url)
    if scp:
        scheme, host, userinfo = "ssh", scp.group("host"), ""
    else:
        try:
            parsed = urlparse(clone_url)
        except ValueError as exc:  # e.g. an unclosed "[" of an IPv6 address
            raise CloneUrlRefused(f"the clone URL does not parse: {exc}") from exc
        scheme, host = parsed.scheme.lower(), (parsed.hostname or "")
        userinfo = parsed.password or ""
        if parsed.username and scheme != "ssh":
            userinfo = userinfo or parsed.username
    allowed = _schemes_allowed(staff)
    if scheme not in allowed:
        raise CloneUrlRefused(
            f"clone URLs must use {' or '.join(allowed) or 'a scheme in GIT_ALLOWED_SCHEMES'}"
            f", not {scheme or 'no scheme'!r}"
            + (" (plain http is for staff only)" if scheme in STAFF_ONLY_SCHEMES else "")
        )
    if not host:
        raise CloneUrlRefused("the clone URL names no host")
    if userinfo:
        raise CloneUrlRefused(
            "credentials do not belong in the clone URL; the provider's token is used"
        )
    allowlist = [h.lower() for h in settings.REPOSITORY_HOST_ALLOWLIST if h]
    if allowlist and host.lower() not in allowlist:
        raise CloneUrlRefused(f"host {host!r} is not in REPOSITORY_HOST_ALLOWLIST")
    try:
        endpoint = endpoint_of(clone_url)
        if endpoint is None:
            raise CloneUrlRefused("the clone URL names no host")
        if resolve:
            # A name that does not resolve yet may be registered: every use resolves it
            # again and refuses it then.
            endpoint_check(endpoint, unresolved_ok=True)
    except AddressRefused as exc:
        raise CloneUrlRefused(str(exc)) from exc


def clone_url_check(clone_url: str, *, staff: bool, resolve: bool = True) -> None:
    """Raise CloneUrlRefused unless ``clone_url`` may be registered by this caller."""
    clone_url = clone_url.strip()
    if not clone_url:
        raise CloneUrlRefused("the clone URL is empty")
    if clone_url.startswith("-") or "::" in clone_url.split("/", 1)[0]:
        raise CloneUrlRefused("transport helpers and option-like URLs are refused")
    path = _local_path(clone_url)
    if path is None:
        _check_remote(clone_url, staff=staff, resolve=resolve)
        return
    if not staff:
        raise CloneUrlRefused("only staff may register a local (on-disk) repository")
    _check_local(path)


def clone_url_check_before_use(clone_url: str) -> None:
    """The rules that hold whoever registered the URL: checked before every clone and
    push, so a row that predates a rule (or was written around the API) is never used.
    The address is checked by the git operation itself, right before it connects."""
    clone_url_check(clone_url, staff=True, resolve=False)
