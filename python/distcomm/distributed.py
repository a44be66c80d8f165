"""``import distcomm.distributed as dist``: the same API as ``import distcomm as dist``."""

from . import *  # noqa: F401,F403
from . import __all__  # noqa: F401
