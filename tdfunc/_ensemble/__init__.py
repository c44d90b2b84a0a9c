"""``Ensemble`` and its batched engine: N members of one architecture run as batched kernels.

- ``ensemble.py``: ``Ensemble``; ``layout.py``: its stacked modules and flat leaf layout;
  ``members.py``: member selections and per-member state dicts; ``member_inputs.py``:
  ``in_dims`` and the member dim of the inputs;
- ``registry.py``: ``register_batched``, the per-type registry and ``BatchContext``;
- ``layers.py``: the built-in layers (Linear, convolutions, norms, dropout...);
  ``recurrent.py``: RNN, GRU, LSTM and their cells; ``transposed_conv.py``,
  ``instance_norm.py``, ``pairwise.py`` (Bilinear, CosineSimilarity,
  PairwiseDistance), ``embedding_bag.py``, ``sample_layers.py`` (pooling, padding,
  upsampling and other per-sample layers);
- ``plan.py``: walks a template module and builds its batched forward
  (``build_batched_plan``);
- ``trace.py`` and ``graph_ops.py``: custom ``forward`` code through ``torch.fx``;
  ``functional_ops.py``: its ``torch.nn.functional`` calls;
- ``explain.py``: ``Ensemble.explain()`` and the fallback warning; ``layer_table.py``:
  the published table of batched layers, generated from the registry;
- ``checks.py``: members must be structurally equal; ``verify.py``: registered
  functions are checked on first use; ``cache.py``: derived leaves kept between calls.

The top floor: may import the public API (``tdfunc._assembly``) and
``tdfunc._modules.slots`` (the walk over a module's slots); nothing below that.
"""

from .plan import Report as Report
from .plan import build_batched_plan as build_batched_plan
from .registry import BatchContext as BatchContext
from .registry import register_batched as register_batched
