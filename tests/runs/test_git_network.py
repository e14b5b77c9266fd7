"""Which addresses count as the platform's own network, and configuration of the git
network rules that fails loudly."""

from __future__ import annotations

import ipaddress

import pytest
from django.core.exceptions import ImproperlyConfigured

from runs.git_network import address_kind, connection_for
from runs.gitproviders.credentials import Origin, provider_git_origins

pytestmark = pytest.mark.no_services


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("0.0.0.0", "unspecified"),  # noqa: S104
        ("10.0.0.1", "private"),
        ("169.254.169.254", "metadata service"),
        ("169.254.1.1", "metadata service"),
        ("fd00:ec2::254", "metadata service"),
        ("168.63.129.16", "metadata service"),
        ("fe80::1", "link-local"),
        ("224.0.0.1", "multicast"),
        ("::ffff:10.0.0.1", "private"),
        ("2002:7f00:1::", "loopback"),
        ("64:ff9b::7f00:1", "loopback"),
        ("100.64.0.1", "non-global"),
        ("8.8.8.8", ""),
        ("2606:4700::1111", ""),
    ],
)
def test_address_kinds(address, kind):
    assert address_kind(ipaddress.ip_address(address)) == kind


def test_a_bad_network_or_scheme_setting_fails_loudly(settings):
    settings.GIT_INTERNAL_HOSTS = []
    settings.GIT_INTERNAL_NETWORKS = ["10.0.0.0/33"]
    with pytest.raises(ImproperlyConfigured, match="GIT_INTERNAL_NETWORKS"):
        connection_for("https://10.0.0.1/x.git")
    settings.GIT_ALLOWED_SCHEMES = ["https", "git"]
    with pytest.raises(ImproperlyConfigured, match="GIT_ALLOWED_SCHEMES"):
        connection_for("https://10.0.0.1/x.git")
    settings.GIT_ALLOWED_SCHEMES = ["https"]
    settings.GITHUB_GIT_HOSTS = ["ftp://github.com"]
    with pytest.raises(ImproperlyConfigured, match="GITHUB_GIT_HOSTS"):
        provider_git_origins("github")


def test_the_provider_git_hosts_follow_the_api_url(settings):
    settings.GITHUB_GIT_HOSTS = settings.GITLAB_GIT_HOSTS = []
    settings.GITHUB_API_URL = "https://api.github.com"
    settings.GITLAB_API_URL = "https://gitlab.example:8443/api/v4"
    assert provider_git_origins("github") == [Origin("https", "github.com", 443)]
    assert provider_git_origins("gitlab") == [Origin("https", "gitlab.example", 8443)]
    settings.GITHUB_API_URL = "https://ghe.example/api/v3"
    assert provider_git_origins("github") == [Origin("https", "ghe.example", 443)]
    settings.GITHUB_GIT_HOSTS = ["ghe.example", "http://10.0.0.5:8080"]
    assert provider_git_origins("github") == [
        Origin("https", "ghe.example", 443),
        Origin("http", "10.0.0.5", 8080),
    ]
    assert provider_git_origins("local") == []
