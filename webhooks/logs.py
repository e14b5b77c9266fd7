"""The webhooks app's structured logger."""

import structlog

log = structlog.get_logger("agentplatform.webhooks")
