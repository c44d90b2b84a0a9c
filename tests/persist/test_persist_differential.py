"""Random containers and random sequences of user operations on saved directories.

The reference is a model without tdfunc: every data file is a plain tensor (a
``Cell``) and every non-tensor entry a Python value. A generation of a directory
maps each key path to its cells; a container in the user's hands (what ``memmap``
or ``load_memmap`` returned, a clone, ...) reads the cells of the generation it
came from. Writes through a container write its cells; a save makes a new
generation (new cells, except the files of the current generation a loaded
container saves back to its own directory, which a save keeps as they are). After
every operation each container in hand, and a fresh load, must equal the model,
compared leaf by leaf with ``torch.equal``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tdfunc import NonTensorData, TensorClass, TensorDict

DTYPES = [
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.float16,
    torch.complex64,
    torch.int8,
    torch.uint8,
    torch.int64,
    torch.bool,
]
KEYS = ["a", "A", "b", "x.y", "..", "meta.json", "_tensordict", "é"]
VALUES = st.one_of(
    st.text(max_size=4),
    st.none(),
    st.dictionaries(st.sampled_from(["p", "q"]), st.integers(-3, 3), max_size=2),
)


class Pair(TensorClass):
    x: torch.Tensor
    tag: Any = None


class Cell:
    """The content of one data file."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.t = tensor.clone()


class Value:
    """One non-tensor entry."""

    def __init__(self, value: Any) -> None:
        self.v = value


# ---------------------------------------------------------------------------- trees
@st.composite
def tensors(draw, batch: list) -> torch.Tensor:
    """A tensor of batch ``batch``: contiguous, transposed, strided or expanded."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = batch + draw(st.lists(st.integers(0, 3), max_size=2))
    layout = draw(st.sampled_from(["plain", "transposed", "strided", "expanded"]))
    seed = draw(st.integers(0, 2**16))

    def values(size) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        base = torch.randint(-4, 5, list(size), generator=g)
        return base > 0 if dtype is torch.bool else base.to(dtype)

    if layout == "transposed" and len(shape) >= 2:
        return values(shape[:-2] + [shape[-1], shape[-2]]).transpose(-1, -2)
    if layout == "strided" and shape:
        return values(shape[:-1] + [2 * shape[-1]])[..., ::2]
    if layout == "expanded" and shape:
        return values([1] + shape[1:]).expand(shape)
    return values(shape)


@st.composite
def trees(draw, batch: list | None = None, depth: int = 0) -> dict:
    """A plain description: {"batch": [...], "class": ..., "entries": {key: item}}.

    An item is a tensor, ("value", python value) or a nested description.
    """
    if batch is None:
        batch = draw(st.lists(st.integers(0, 3), max_size=2))
    keys = draw(st.lists(st.sampled_from(KEYS), max_size=4, unique=True))
    entries: dict = {}
    for key in keys:
        kind = draw(st.sampled_from(["tensor", "tensor", "value", "nested", "pair"]))
        if kind == "nested" and depth < 2:
            extra = draw(st.lists(st.integers(0, 2), max_size=1))
            entries[key] = draw(trees(batch + extra, depth + 1))
        elif kind == "pair":
            entries[key] = {
                "batch": batch,
                "class": Pair,
                "entries": {"x": draw(tensors(batch)), "tag": ("value", draw(VALUES))},
            }
        elif kind == "value":
            entries[key] = ("value", draw(VALUES))
        else:
            entries[key] = draw(tensors(batch))
    names = None
    if batch and depth == 0 and draw(st.booleans()):  # nested levels inherit them
        names = [f"d{i}" if draw(st.booleans()) else None for i in range(len(batch))]
    return {"batch": batch, "class": TensorDict, "entries": entries, "names": names}


def build(tree: dict) -> Any:
    """The container ``tree`` describes (fresh tensors, the layouts as drawn)."""
    data: dict = {}
    for key, item in tree["entries"].items():
        if isinstance(item, torch.Tensor):
            data[key] = item.clone() if item.is_contiguous() else item
        elif isinstance(item, tuple):
            data[key] = NonTensorData(data=item[1], batch_size=tree["batch"])
        else:
            data[key] = build(item)
    if tree["class"] is Pair:
        return Pair(x=data["x"], tag=data["tag"], batch_size=tree["batch"])
    return TensorDict(data, batch_size=tree["batch"], names=tree.get("names"))


def paths(tree: dict, at: tuple = ()):
    """(path, item) of every leaf."""
    for key, item in tree["entries"].items():
        if isinstance(item, dict):
            yield from paths(item, at + (key,))
        else:
            yield at + (key,), item


def generation(tree: dict) -> dict:
    """A new generation: new cells for every leaf of ``tree``."""
    return {
        path: Cell(item) if isinstance(item, torch.Tensor) else Value(item[1])
        for path, item in paths(tree)
    }


# ---------------------------------------------------------------------------- checks
def read(container: Any, path: tuple) -> Any:
    """The entry at ``path`` (a non-tensor entry reads as its value)."""
    node = container
    for key in path:
        node = getattr(node, key) if isinstance(node, TensorClass) else node[key]
    return node


def check(container: Any, tree: dict, cells: dict, where: str) -> None:
    """``container`` has ``tree``'s structure and the values of ``cells``."""
    assert type(container) is tree["class"], where
    assert list(container.batch_size) == tree["batch"], where
    names = tree.get("names")
    if names is not None and any(n is not None for n in names):
        assert list(container.names) == names, where
    for path, _item in paths(tree):
        value = read(container, path)
        cell = cells[path]
        if isinstance(cell, Cell):
            assert isinstance(value, torch.Tensor), (where, path)
            assert value.dtype == cell.t.dtype, (where, path)
            assert torch.equal(value.as_subclass(torch.Tensor), cell.t), (
                where,
                path,
                value,
                cell.t,
            )
        else:
            assert value == cell.v, (where, path, value, cell.v)
    if tree["class"] is TensorDict:  # and no entry the model does not have
        listed = {k if isinstance(k, tuple) else (k,) for k in container.keys(True)}
        assert listed == {p for p, _ in paths(tree)} | set(levels(tree)), where


def levels(tree: dict, at: tuple = ()):
    """The path of every nested container (a TensorClass's fields included)."""
    for key, item in tree["entries"].items():
        if isinstance(item, dict):
            yield at + (key,)
            yield from levels(item, at + (key,))


# ---------------------------------------------------------------------------- the test
class World:
    """The directory under test, the containers in hand, and the model."""

    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, "ckpt")
        self.tree: dict | None = None  # what is on disk, and its cells
        self.disk: dict | None = None
        # (container, tree, its cells, the generation it came from: None for a copy)
        self.held: list[tuple[Any, dict, dict, dict | None]] = []

    def saved(self, container: Any, tree: dict, cells: dict) -> None:
        self.tree, self.disk = tree, cells
        self.held.append((container, tree, in_hand(cells), cells))

    def check(self, step: str) -> None:
        for i, (container, tree, cells, _) in enumerate(self.held):
            check(container, tree, cells, f"{step}: container {i}")
        if self.disk is not None:
            check(TensorDict.load_memmap(self.path), self.tree, self.disk, f"{step}: a fresh load")


def in_hand(cells: dict) -> dict:
    """The cells of a container in hand: the data files it maps, and its own copy of the
    non-tensor values (read when it was saved or loaded; its writes reach the file, but
    other containers keep the values they read)."""
    return {p: Value(c.v) if isinstance(c, Value) else c for p, c in cells.items()}


def kept(disk: dict, path: tuple, cell: Any, claimed: set) -> bool:
    """Whether a save keeps the file of ``cell`` for the entry at ``path``: a file of the
    current generation in the entry's own directory (any key of that level), kept for
    one entry only (``claimed``: the files already kept by this save)."""
    current = any(c is cell and p[:-1] == path[:-1] for p, c in disk.items())
    if not isinstance(cell, Cell) or not current or id(cell) in claimed:
        return False
    claimed.add(id(cell))
    return True


def _tensor_paths(tree: dict) -> list:
    return [p for p, item in paths(tree) if isinstance(item, torch.Tensor)]


def _value_paths(tree: dict) -> list:
    return [p for p, item in paths(tree) if not isinstance(item, torch.Tensor)]


def _new_values(data, cell: Cell) -> torch.Tensor:
    seed = data.draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    new = torch.randint(-4, 5, list(cell.t.shape), generator=g)
    return new > 0 if cell.t.dtype is torch.bool else new.to(cell.t.dtype)


def step(world: World, data, op: str) -> None:
    held = world.held
    if op == "save":
        tree = data.draw(trees())
        threads = data.draw(st.sampled_from([0, 0, 2]))
        saved = build(tree).memmap(world.path, num_threads=threads)
        world.saved(saved, tree, generation(tree))
    elif op == "memmap_":
        tree = data.draw(trees())
        source = build(tree)
        originals = [read(source, p) for p in _tensor_paths(tree)]
        source.memmap_(world.path)
        for original in originals:  # the saved values no longer depend on them
            if original.numel() and original._base is None and original.is_contiguous():
                original.zero_()
        world.saved(source, tree, generation(tree))
    elif op == "memmap_like":
        tree = data.draw(trees())
        source = build(tree)
        like = generation(tree)
        for cell in like.values():  # new files that read as zeros; values are kept
            if isinstance(cell, Cell):
                cell.t.zero_()
        world.saved(source.memmap_like(world.path), tree, like)
    elif op == "load" and world.disk is not None:
        loaded = TensorDict.load_memmap(world.path)
        held.append((loaded, world.tree, in_hand(world.disk), world.disk))
    elif op == "resave" and held:
        container, tree, cells, gen = held[data.draw(st.integers(0, len(held) - 1))]
        if gen is None:
            return
        disk = world.disk or {}
        claimed: set = set()
        new = {}
        for path, cell in cells.items():
            # a file of the current generation is kept (the object in hand maps it)
            keep = kept(disk, path, cell, claimed)
            new[path] = cell if keep else type(cell)(cell.t if isinstance(cell, Cell) else cell.v)
        world.saved(container.memmap(world.path, copy_existing=True), tree, new)
    elif op == "mix" and held:
        # a new container of tensors taken from one in hand, some of them twice, saved
        # over the directory: a file of the current generation is kept for one entry
        container, tree, cells, gen = held[data.draw(st.integers(0, len(held) - 1))]
        saved = gen is not None
        sources = [
            p
            for p in _tensor_paths(tree)
            if not isinstance(read(container, p[:-1] or ()), TensorClass)
        ]
        if not sources:
            return
        keys = data.draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True))
        picks = [data.draw(st.sampled_from(sources)) for _ in keys]
        disk = world.disk or {}
        claimed: set = set()
        new_tree = {"batch": tree["batch"], "class": TensorDict, "entries": {}}
        new_cells = {}
        mixed = TensorDict({}, batch_size=tree["batch"])
        for key, path in zip(keys, picks):
            cell = cells[path]
            value = read(container, path)
            if len(path) > 1:  # an entry of a nested level: moved to the top level
                value = value.clone() if not saved else value
            shared = kept(disk, (key,), cell, claimed) if len(path) == 1 else False
            new_cells[(key,)] = cell if shared else Cell(cell.t)
            new_tree["entries"][key] = cell.t
            mixed[key] = value
        world.saved(mixed.memmap(world.path, copy_existing=True), new_tree, new_cells)
    elif op == "consolidate" and held:
        # one file holding every leaf, and the container read back from it: both map it
        container, tree, cells, _ = held[data.draw(st.integers(0, len(held) - 1))]
        filename = os.path.join(os.path.dirname(world.path), "consolidated.bin")
        packed = container.consolidate(filename=filename, existsok=True)
        shared = {p: Cell(c.t) if isinstance(c, Cell) else c for p, c in cells.items()}
        held.append((packed, tree, in_hand(shared), None))
        held.append((TensorDict.from_consolidated(filename), tree, in_hand(shared), None))
    elif op == "clone" and held:
        container, tree, cells, _ = held[data.draw(st.integers(0, len(held) - 1))]
        copied = {p: Cell(c.t) if isinstance(c, Cell) else Value(c.v) for p, c in cells.items()}
        held.append((container.clone(), tree, copied, None))
    elif op in ("write", "index_write", "update_", "copy_") and held:
        i = data.draw(st.integers(0, len(held) - 1))
        container, tree, cells, _ = held[i]
        tensor_paths = _tensor_paths(tree)
        if not tensor_paths:
            return
        path = data.draw(st.sampled_from(tensor_paths))
        cell = cells[path]
        new = _new_values(data, cell)
        if op == "write":
            read(container, path)[...] = new
            cell.t[...] = new
        elif op == "index_write":
            if not tree["batch"] or tree["batch"][0] == 0:
                return
            index = data.draw(st.integers(0, tree["batch"][0] - 1))
            read(container[index], path)[...] = new[index]
            cell.t[index] = new[index]
        else:
            source = TensorDict({}, batch_size=[])
            source.set(path, new)
            method = container.update_ if op == "update_" else container.copy_
            method(source)
            cell.t[...] = new
    elif op == "set_value" and held:
        container, tree, cells, gen = held[data.draw(st.integers(0, len(held) - 1))]
        value_paths = [p for p in _value_paths(tree) if p[-1] != "tag"]
        if not value_paths or isinstance(container, TensorClass):
            return
        path = data.draw(st.sampled_from(value_paths))
        value = data.draw(VALUES)
        cells[path].v = value  # in hand, in every case
        if gen is not None and gen is not world.disk:
            # a container of a replaced save: writing into the newer save would mix them
            with pytest.raises(RuntimeError, match="saved again"):
                container.update_({path: NonTensorData(data=value)})
        else:
            container.update_({path: NonTensorData(data=value)})
            if gen is not None:
                gen[path].v = value
    elif op == "foreign_file" and world.disk is not None:
        # a file of the user's own in a checkpoint directory: kept, never removed
        with open(os.path.join(world.path, "notes.txt"), "w") as f:
            f.write("mine")
    world.check(op)
    if os.path.exists(os.path.join(world.path, "notes.txt")):
        with open(os.path.join(world.path, "notes.txt")) as f:
            assert f.read() == "mine"


OPS = [
    "save",
    "memmap_",
    "memmap_like",
    "load",
    "resave",
    "clone",
    "consolidate",
    "mix",
    "write",
    "index_write",
    "update_",
    "copy_",
    "set_value",
    "foreign_file",
]


@settings(
    max_examples=int(os.environ.get("TDFUNC_FUZZ_EXAMPLES", "20")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data(), ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=8))
def test_operations_match_the_model(data, ops):
    root = tempfile.mkdtemp()
    try:
        world = World(root)
        for op in ops:
            step(world, data, op)
    finally:
        shutil.rmtree(root, ignore_errors=True)
