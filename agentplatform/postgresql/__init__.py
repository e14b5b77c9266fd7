"""Django's PostgreSQL backend, with the check its connection pool makes (see ``base``)."""
