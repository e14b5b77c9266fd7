"""The embedded broker: kombu's filesystem transport with atomic message files.

The stock transport writes a message file in place, so a consumer polling the folder can
move and read it before the producer finished writing (an empty or partial message).
Writing to a temporary name and renaming makes each message appear whole or not at all.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class AtomicFilesystemChannel(filesystem.Channel):
    # kombu-stubs name the base parameter ``message``; kombu passes it positionally.
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f".{name}.partial")
        try:
            with open(partial, "wb") as handle:
                handle.write(str_to_bytes(dumps(payload)))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class AtomicFilesystemTransport(filesystem.Transport):
    Channel = AtomicFilesystemChannel


TRANSPORT_ALIASES.setdefault("fsatomic", "agentplatform.broker:AtomicFilesystemTransport")
