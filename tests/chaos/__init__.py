"""The fault-injection suite behind ``make chaos`` (see README, Reliability)."""
