"""Exceptions: one class per ``dc_status``, all derived from :class:`DistError`."""

from typing import Dict, Optional, Type

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

#: The library's status codes (``dc_status``) by value.
STATUS_NAMES: Dict[int, str] = {
    0: "DC_SUCCESS",
    1: "DC_ERR_INVALID_ARGUMENT",
    2: "DC_ERR_INVALID_USAGE",
    3: "DC_ERR_TIMEOUT",
    4: "DC_ERR_PEER_LOST",
    5: "DC_ERR_MISMATCH",
    6: "DC_ERR_ABORTED",
    7: "DC_ERR_UNAVAILABLE",
    8: "DC_ERR_SYSTEM",
    9: "DC_ERR_RENDEZVOUS",
    10: "DC_ERR_INTERNAL",
    11: "DC_ERR_REMOTE",
}


class DistError(RuntimeError):
    """A failed distcomm operation.

    Attributes:
        status: the library's ``dc_status`` value (an ``int``).
        status_name: its name, e.g. ``"DC_ERR_TIMEOUT"``.
        message: the explanation; for library failures the text of ``dc_last_error()``, which
            names the call, the rank and the peer involved.
    """

    #: The status this class stands for (subclasses override it).
    status_code: int = 10

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

    status_code = 1


class DistInvalidUsage(DistError):
    """Wrong state: not initialised, initialised twice, a destroyed group, an unfinished request."""

    status_code = 2


class DistTimeoutError(DistError):
    """An operation or the rendezvous did not finish within the timeout."""

    status_code = 3


class DistPeerLostError(DistError):
    """A peer process died or closed its connection."""

    status_code = 4


class DistMismatchError(DistError):
    """Ranks called collectives that disagree (kind, dtype, op, root or count)."""

    status_code = 5


class DistAbortedError(DistError):
    """The communicator was aborted, here or on a peer."""

    status_code = 6


class DistUnavailableError(DistError):
    """The library, a backend or a feature is not available."""

    status_code = 7


class DistSystemError(DistError):
    """An OS call failed (socket, port in use, file)."""

    status_code = 8


class DistRendezvousError(DistError):
    """The group could not form: store unreachable, token refused."""

    status_code = 9


class DistInternalError(DistError):
    """A bug in the library (including a caught panic)."""

    status_code = 10


class DistRemoteError(DistError):
    """A remote procedure failed: the handler raised or failed, or the function is unknown there."""

    status_code = 11


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
