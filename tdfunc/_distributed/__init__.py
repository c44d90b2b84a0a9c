"""Beyond one process: ``torch.distributed`` messages, sharded ensembles, ``map``.

- ``collectives.py``: ``DistributedMixin`` (``send``/``recv``/``isend``/``irecv``, collectives);
- ``gather.py``: ``GatherMixin`` (``all_gather``, ``scatter``, built on those messages);
- ``remote.py``: ``RemoteMixin`` (``init_remote``/``from_remote_init``: the structure as JSON);
- ``layout.py``: the structure digest and flat layout of a message; ``work.py``: handles;
- ``sharded.py``: ``shard_ensemble`` / ``gather_members``; ``map.py``: ``MapMixin`` (worker pools).

May import: ``tdfunc._core``, and ``tdfunc._persist.sharing``: ``map`` sends file-backed
leaves by file name and file identity, the check ``MemoryMappedTensor``'s pickling uses.
"""

from .collectives import DistributedMixin as DistributedMixin
from .gather import GatherMixin as GatherMixin
from .map import MapMixin as MapMixin
from .remote import RemoteMixin as RemoteMixin
from .work import DistributedWork as DistributedWork
