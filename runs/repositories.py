"""Which clone URLs a repository may have.

A clone URL decides what the platform's own git reads, with the platform's file
permissions and credentials: a workspace admin who could point it at a path on the
platform's disk (another tenant's repository, the platform's own files) would read it.
So: workspace admins register ``https`` or ``ssh`` URLs only; local paths and
``file://`` URLs are for staff, and only under ``LOCAL_REPOSITORY_ROOTS``; an optional
``REPOSITORY_HOST_ALLOWLIST`` limits the hosts; credentials never go in the URL (they
would be stored in a ``.git/config``): the provider's token is passed to git outside the
sandbox. The same rules (minus the staff ones) are checked again before every clone.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlparse

from django.conf import settings

# user@host:path, git's scp-like ssh syntax.
SCP_LIKE = re.compile(r"^(?:[A-Za-z0-9._-]+@)?(?P<host>[A-Za-z0-9.-]+):(?!//)(?P<path>.+)$")
REMOTE_SCHEMES = {"https", "ssh"}
STAFF_REMOTE_SCHEMES = {"https", "ssh", "http", "git"}


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


def _check_remote(clone_url: str, *, staff: bool) -> None:
    scp = SCP_LIKE.match(clone_url)
    if scp:
        scheme, host, userinfo = "ssh", scp.group("host"), ""
    else:
        parsed = urlparse(clone_url)
        scheme, host = parsed.scheme.lower(), (parsed.hostname or "")
        userinfo = parsed.password or ""
        if parsed.username and scheme != "ssh":
            userinfo = userinfo or parsed.username
    allowed = STAFF_REMOTE_SCHEMES if staff else REMOTE_SCHEMES
    if scheme not in allowed:
        raise CloneUrlRefused(
            f"clone URLs must use {' or '.join(sorted(allowed))}, not {scheme or 'no scheme'!r}"
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


def clone_url_check(clone_url: str, *, staff: bool) -> None:
    """Raise CloneUrlRefused unless ``clone_url`` may be registered by this caller."""
    clone_url = clone_url.strip()
    if not clone_url:
        raise CloneUrlRefused("the clone URL is empty")
    if clone_url.startswith("-") or "::" in clone_url.split("/", 1)[0]:
        raise CloneUrlRefused("transport helpers and option-like URLs are refused")
    path = _local_path(clone_url)
    if path is None:
        _check_remote(clone_url, staff=staff)
        return
    if not staff:
        raise CloneUrlRefused("only staff may register a local (on-disk) repository")
    _check_local(path)


def clone_url_check_before_clone(clone_url: str) -> None:
    """The rules that hold whoever registered the URL: checked before every clone, so a
    row that predates a rule (or was written around the API) cannot be cloned."""
    clone_url_check(clone_url, staff=True)
