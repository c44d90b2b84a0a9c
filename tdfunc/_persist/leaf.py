"""One non-tensor leaf (``NonTensorData`` or ``NonTensorStack``) saved on its own.

In tdfunc's layout the leaf is saved as the TensorDict that holds it under
``"data"`` (the leaf's ``_tensordict`` view), with the leaf's class recorded in
``meta.json``; loading that directory gives the leaf back, memory-mapped: an
in-place update (``update_``) rewrites its entry, as it does for a leaf saved
inside a TensorDict. ``format="tensordict"`` writes tensordict's layout for a
standalone leaf (a ``meta.json`` holding the values), which both libraries read.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from .._core.helpers.class_names import class_name
from .._core.helpers.hooks import HOOKS
from .._core.helpers.nontensor import NonTensorData, NonTensorStack
from .memmap_tensor import MemmapFileExistsError
from .save import save
from .saved_paths import remember_path
from .tensordict_read import read_tensordict_layout
from .tensordict_write import save_tensordict_layout
from .write_back import bind


class LeafLoader:
    """Builds, for a saved level whose class is a non-tensor leaf, the leaf in ``"data"``."""

    def __init__(self, cls: type) -> None:
        self.cls = cls

    def _from_pytree(self, data: dict, batch_size: torch.Size, device, names) -> NonTensorData:
        leaf = data.get("data")
        if len(data) != 1 or type(leaf) is not self.cls or leaf.batch_size != batch_size:
            raise ValueError(
                f"load_memmap: the saved {self.cls.__name__} is corrupt: its meta.json must hold "
                f"exactly one non-tensor entry 'data' of batch size {list(batch_size)}, got "
                f"{sorted(data)}."
            )
        return leaf


LEAF_LOADERS = {class_name(cls): LeafLoader(cls) for cls in (NonTensorData, NonTensorStack)}


def memmap_leaf(
    leaf: NonTensorData,
    prefix,
    *,
    api: str,
    inplace: bool,
    existsok: bool = True,
    fsync: bool = False,
    format: str = "tdfunc",
) -> NonTensorData:
    """Save ``leaf`` in ``prefix``; the saved leaf (``leaf`` itself when ``inplace``), locked."""
    if prefix is None:
        raise ValueError(
            f"{api}: a non-tensor value saved on its own needs a prefix (its values live in "
            f"the directory's meta.json); pass a directory, e.g. {api.rpartition('.')[2]}(path)."
        )
    directory = os.path.abspath(os.fspath(prefix))
    if format == "tensordict":
        if not existsok and os.path.lexists(os.path.join(directory, "meta.json")):
            raise MemmapFileExistsError(
                f"{api}: {directory} already holds saved data (meta.json exists) and "
                f"existsok=False; pass existsok=True to replace it."
            )
        save_tensordict_layout(leaf, directory, api, fsync=fsync)
        saved = read_tensordict_layout(directory, api)
    elif format == "tdfunc":
        holder = HOOKS.tensordict._new_unsafe({"data": leaf}, leaf.batch_size, leaf.device, None)
        saved = save(
            holder,
            directory,
            api=api,
            inplace=False,
            like=False,
            copy_existing=False,
            num_threads=0,
            return_early=False,
            existsok=existsok,
            fsync=fsync,
            top_class=class_name(type(leaf)),
        )._data["data"]
    else:
        raise ValueError(f"{api}: format must be 'tdfunc' or 'tensordict', got {format!r}.")
    if inplace:
        write_back = saved.__dict__.get("_write_back")
        if write_back is not None:  # the save's binding: its directory and generation
            leaf._is_memmap = True
            leaf._write_back = write_back
        else:
            bind(leaf, directory, "data", None)
        saved = leaf
    saved._is_locked = True
    remember_path(saved, directory)
    return saved


def load_leaf(prefix, api: str, cls: type, *args: Any, **kwargs: Any) -> NonTensorData:
    """The leaf saved in ``prefix`` (``TypeError`` when it holds a container)."""
    loaded = HOOKS.tensordict.load_memmap(prefix, *args, **kwargs)
    if not isinstance(loaded, cls):
        raise TypeError(
            f"{api}: {os.fspath(prefix)} holds a {type(loaded).__name__}, not a {cls.__name__}; "
            f"load it with TensorDict.load_memmap(prefix)."
        )
    return loaded


def lock(obj: Any) -> Any:
    """Lock a loaded container, or mark a loaded leaf locked."""
    if isinstance(obj, NonTensorData):
        obj._is_locked = True
        return obj
    return obj.lock_()
