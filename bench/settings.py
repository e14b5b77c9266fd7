"""Settings for benchmark processes: the product's, plus the one-INSERT baseline view."""

from agentplatform.settings import *  # noqa: F403

ROOT_URLCONF = "bench.urls"
