"""The REST API: thin views over runs/jobs services, scoped per workspace."""
