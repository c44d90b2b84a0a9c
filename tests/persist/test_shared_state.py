"""``is_shared()`` is read from the leaves: every tensor leaf's storage shared between
processes, memory-mapped files included, as torch's own ``Tensor.is_shared()`` says
(tensordict keeps a flag that only ``share_memory_()`` sets; see the differences page)."""

from __future__ import annotations

import torch

from tdfunc import MemoryMappedTensor, TensorDict


def test_is_shared_agrees_with_the_leaves_own_answer(tmp_path):
    plain = TensorDict(a=torch.zeros(3), n={"b": torch.ones(3)}, batch_size=[3])
    mapped = plain.memmap(tmp_path / "m")
    loaded = TensorDict.load_memmap(tmp_path / "m")
    by_hand = TensorDict(a=torch.zeros(3).share_memory_(), batch_size=[3])
    mapped_leaf = TensorDict(a=MemoryMappedTensor.from_tensor(torch.zeros(3)), batch_size=[3])
    for td in (plain, mapped, loaded, by_hand, mapped_leaf, mapped[1:], mapped["n"]):
        leaves = [leaf.is_shared() for leaf in td.values(include_nested=True, leaves_only=True)]
        assert td.is_shared() == all(leaves)
        assert ("is_shared=True)" in repr(td).splitlines()[-1]) == all(leaves)
    assert mapped.is_shared() and mapped.is_memmap()  # is_memmap tells the two apart
    assert by_hand.is_shared() and not by_hand.is_memmap()
    assert not plain.is_shared() and not mapped.clone().is_shared()
