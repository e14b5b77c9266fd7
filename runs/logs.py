"""The runs app's structured logger."""

import structlog

log = structlog.get_logger("agentplatform.runs")
