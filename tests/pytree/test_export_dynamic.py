"""torch.export with a dynamic batch dim through TensorDict and TensorClass inputs and outputs.

torch.export matches the ``dynamic_shapes`` of a registered pytree node against
the node's children: for a container, one entry per tensor leaf, in the order of
``keys(include_nested=True, leaves_only=True)``.
"""

from __future__ import annotations

import io

import torch
from torch import nn

from tdfunc import TensorDict, tensorclass


@tensorclass
class _Obs:
    pos: torch.Tensor
    vel: torch.Tensor


class _Model(nn.Module):
    def forward(self, td, obs):
        out = td["a"] * 2 + td["b", "c"].sum(-1) + obs.pos.sum(-1, keepdim=True)
        return TensorDict(out=out, speed=obs.vel.norm(dim=-1), batch_size=td.batch_size)


def _inputs(rows: int):
    td = TensorDict(
        a=torch.randn(rows, 3),
        b=TensorDict(c=torch.randn(rows, 3, 2), batch_size=[rows, 3]),
        batch_size=[rows],
    )
    return td, _Obs(pos=torch.randn(rows, 2), vel=torch.randn(rows, 2), batch_size=[rows])


def test_dynamic_batch_for_tensordict_and_tensorclass_inputs_and_outputs():
    batch = torch.export.Dim("batch")
    td, obs = _inputs(4)
    assert len(list(td.keys(include_nested=True, leaves_only=True))) == 2
    shapes = ([{0: batch}, {0: batch}], [{0: batch}, {0: batch}])
    program = torch.export.export(_Model(), (td, obs), dynamic_shapes=shapes)
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    # the program keeps its example inputs: loading them needs the container classes allowed
    with torch.serialization.safe_globals([TensorDict, _Obs]):
        loaded = torch.export.load(buffer).module()
    for rows in (4, 7):
        td, obs = _inputs(rows)
        out = loaded(td, obs)
        assert isinstance(out, TensorDict) and out.batch_size == torch.Size([rows])
        expected = td["a"] * 2 + td["b", "c"].sum(-1) + obs.pos.sum(-1, keepdim=True)
        torch.testing.assert_close(out["out"], expected)
        torch.testing.assert_close(out["speed"], obs.vel.norm(dim=-1))
