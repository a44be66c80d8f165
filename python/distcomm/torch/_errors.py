"""The library's failures as the exceptions torch users catch.

Each class derives from torch's own (``torch.distributed.DistBackendError``, or
``DistNetworkError`` for a lost peer and ``DistStoreError`` for a failed rendezvous) *and* from
distcomm's class for the same status, so both ``except dist.DistBackendError`` and
``except distcomm.DistTimeoutError`` catch it. The message is the library's text
(``dc_last_error()``: the call, the rank and the peers involved). Bad arguments are also
``ValueError`` (as torch raises for them), and are raised before anything is sent.
"""

from typing import Dict, Type

import torch.distributed as tdist

from .. import _errors as dc

# status class of distcomm -> torch base class
_TORCH_BASE: Dict[Type[dc.DistError], type] = {
    dc.DistPeerLostError: tdist.DistNetworkError,
    dc.DistRendezvousError: tdist.DistStoreError,
}


def _make(dc_cls: Type[dc.DistError]) -> Type[dc.DistError]:
    base = _TORCH_BASE.get(dc_cls, tdist.DistBackendError)
    name = dc_cls.__name__.replace("Dist", "Distcomm", 1)
    return type(name, (base, dc_cls), {"__module__": __name__, "__doc__": dc_cls.__doc__})


#: distcomm's exception class -> the class raised by the torch backend (same status).
BY_CLASS: Dict[Type[dc.DistError], Type[dc.DistError]] = {
    c: _make(c)
    for c in (
        dc.DistInvalidArgument,
        dc.DistInvalidUsage,
        dc.DistTimeoutError,
        dc.DistPeerLostError,
        dc.DistMismatchError,
        dc.DistAbortedError,
        dc.DistUnavailableError,
        dc.DistSystemError,
        dc.DistRendezvousError,
        dc.DistInternalError,
        dc.DistRemoteError,
    )
}
DistcommError = _make(dc.DistError)
DistcommInvalidArgument = BY_CLASS[dc.DistInvalidArgument]
DistcommTimeoutError = BY_CLASS[dc.DistTimeoutError]
DistcommUnavailableError = BY_CLASS[dc.DistUnavailableError]


def for_status(status: int, message: str) -> dc.DistError:
    """The torch-flavoured exception for a library status."""
    e = dc.error_for_status(status, message)
    return BY_CLASS.get(type(e), DistcommError)(message, status)


def translate(e: BaseException) -> BaseException:
    """A distcomm error raised by the package's helpers, as the torch-flavoured class."""
    if isinstance(e, dc.DistError) and not isinstance(e, tdist.DistError):
        cls = BY_CLASS.get(type(e), DistcommError)
        return cls(e.message, e.status)
    return e


def invalid(message: str) -> dc.DistError:
    return DistcommInvalidArgument(message)


def unavailable(message: str) -> dc.DistError:
    return DistcommUnavailableError(message)
