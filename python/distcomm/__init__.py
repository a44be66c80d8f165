"""distcomm: torch.distributed's API over libdistcomm, on NumPy arrays.

::

    import distcomm as dist           # in place of: import torch.distributed as dist
    import numpy as np

    dist.init_process_group()         # env:// (dcrun, torchrun, srun, mpirun set the variables)
    x = np.ones(4, dtype=np.float32)
    dist.all_reduce(x)                # in place, sum over every rank
    dist.destroy_process_group()

Run with ``dcrun -n 4 python script.py``. The library is found through ``DISTCOMM_LIBRARY``,
next to this package, the install prefixes, or the dynamic loader (see ``distcomm._lib``).

The object collectives (all_gather_object, broadcast_object_list, scatter_object_list,
gather_object, send_object_list, recv_object_list) use pickle: unpickling data from a peer can
run arbitrary code, so use them only between trusted ranks of one job.
"""

from ._core import *  # noqa: F401,F403
from ._core import __all__ as _core_all
from ._errors import *  # noqa: F401,F403
from ._errors import __all__ as _errors_all

__version__ = "0.1.0"
__all__ = list(_core_all) + list(_errors_all) + ["__version__"]
