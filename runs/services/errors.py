"""Why a command is refused: the exceptions the services raise."""

from __future__ import annotations


class CommandRefused(Exception):
    """A command that cannot be carried out; ``code`` is machine-readable."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ApprovalNotAllowed(CommandRefused):
    """The workspace's approval policy does not let this person decide."""


class IdempotencyConflict(CommandRefused):
    def __init__(self) -> None:
        super().__init__(
            "idempotency_key_reused", "this Idempotency-Key was used with a different request"
        )


class IdempotencyKeyReserved(CommandRefused):
    def __init__(self) -> None:
        super().__init__(
            "idempotency_key_reserved",
            "Idempotency-Key values starting with github: or gitlab: are reserved for "
            "tasks the platform creates from provider events",
        )
