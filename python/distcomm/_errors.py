"""Exceptions: one class per ``dc_status``, all derived from :class:`DistError`."""

from typing import Dict, Optional, Type

from ._status import CODES

__all__ = [
    "DistError",
    "DistInvalidArgument",
    "DistInvalidUsage",
    "DistTimeoutError",
    "DistPeerLostError",
    "DistMismatchError",
    "DistAbortedError",
    "DistUnavailableError",
    "DistSystemError",
    "DistRendezvousError",
    "DistInternalError",
    "DistRemoteError",
    "DistBackendError",
    "DistNetworkError",
    "DistStoreError",
    "STATUS_NAMES",
]

#: The library's status codes (``dc_status``) by value, from the generated ``_status`` table.
STATUS_NAMES: Dict[int, str] = {code: name for name, code in CODES.items()}


class DistError(RuntimeError):
    """A failed distcomm operation.

    Attributes:
        status: the library's ``dc_status`` value (an ``int``).
        status_name: its name, e.g. ``"DC_ERR_TIMEOUT"``.
        message: the explanation; for library failures the text of ``dc_last_error()``, which
            names the call, the rank and the peer involved.
    """

    #: The status this class stands for (subclasses override it).
    status_code: int = CODES["DC_ERR_INTERNAL"]

    def __init__(self, message: str = "", status: Optional[int] = None) -> None:
        self.status: int = self.status_code if status is None else int(status)
        self.status_name: str = STATUS_NAMES.get(self.status, "DC_ERR_UNKNOWN")
        self.message: str = message
        super().__init__(f"{self.status_name}: {message}" if message else self.status_name)

    def __reduce__(self):  # keeps the status when pickled (e.g. sent with an object collective)
        return (_rebuild, (type(self), self.message, self.status))


def _rebuild(cls: Type["DistError"], message: str, status: int) -> "DistError":
    return cls(message, status)


class DistInvalidArgument(DistError, ValueError):
    """Bad argument (dtype, layout, length, rank, op); raised before anything is sent."""

    status_code = CODES["DC_ERR_INVALID_ARGUMENT"]


class DistInvalidUsage(DistError):
    """Wrong state: not initialised, initialised twice, a destroyed group, an unfinished request."""

    status_code = CODES["DC_ERR_INVALID_USAGE"]


class DistTimeoutError(DistError):
    """An operation or the rendezvous did not finish within the timeout."""

    status_code = CODES["DC_ERR_TIMEOUT"]


class DistPeerLostError(DistError):
    """A peer process died or closed its connection."""

    status_code = CODES["DC_ERR_PEER_LOST"]


class DistMismatchError(DistError):
    """Ranks called collectives that disagree (kind, dtype, op, root or count)."""

    status_code = CODES["DC_ERR_MISMATCH"]


class DistAbortedError(DistError):
    """The communicator was aborted, here or on a peer."""

    status_code = CODES["DC_ERR_ABORTED"]


class DistUnavailableError(DistError):
    """The library, a backend or a feature is not available."""

    status_code = CODES["DC_ERR_UNAVAILABLE"]


class DistSystemError(DistError):
    """An OS call failed (socket, port in use, file)."""

    status_code = CODES["DC_ERR_SYSTEM"]


class DistRendezvousError(DistError):
    """The group could not form: store unreachable, token refused."""

    status_code = CODES["DC_ERR_RENDEZVOUS"]


class DistInternalError(DistError):
    """A bug in the library (including a caught panic)."""

    status_code = CODES["DC_ERR_INTERNAL"]


class DistRemoteError(DistError):
    """A remote procedure failed: the handler raised or failed, or the function is unknown there."""

    status_code = CODES["DC_ERR_REMOTE"]


# torch.distributed's names for its own exception classes, for scripts that catch them.
DistBackendError = DistError
DistNetworkError = DistPeerLostError
DistStoreError = DistRendezvousError

_BY_STATUS: Dict[int, Type[DistError]] = {
    c.status_code: c
    for c in (
        DistInvalidArgument,
        DistInvalidUsage,
        DistTimeoutError,
        DistPeerLostError,
        DistMismatchError,
        DistAbortedError,
        DistUnavailableError,
        DistSystemError,
        DistRendezvousError,
        DistInternalError,
        DistRemoteError,
    )
}


def error_for_status(status: int, message: str) -> DistError:
    """The exception for a library status (unknown values give a plain :class:`DistError`)."""
    cls = _BY_STATUS.get(int(status), DistError)
    return cls(message, int(status))
