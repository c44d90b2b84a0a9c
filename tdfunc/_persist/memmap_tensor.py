"""``MemoryMappedTensor``: a CPU tensor whose storage is a file mapped in memory.

The tensor maps the whole file (``torch.from_file(..., shared=True)``), so the
operating system reads only the pages that indexing touches, and writes in place
(``t[i] = x``, ``t.copy_(x)``) reach the file. Every other operation returns a
plain ``torch.Tensor`` (a view of the mapping where torch makes views): the
subclass only marks "this tensor *is* that file".

Files are always created under a fresh name (``O_EXCL``) and checked against
the size the dtype and shape need before they are mapped: ``from_file`` would
otherwise silently grow a short file with zeros, and a mapping past the end of
a file crashes the process with ``SIGBUS`` on first access.
"""

from __future__ import annotations

import contextlib
import math
import os
import uuid
from typing import Any

import torch

from .._core.helpers.tracing import compiling as _compiling
from .files import (
    _bytes_of,
    allocate_file,
    check_file,
    check_has_data,
    create_file,
    nbytes_of,
    temp_path,
    write_file,
)
from .nested import (
    component_sizes,
    like_shape,
    nested_flat,
    nested_numel,
    nested_view,
    shape_sizes,
)


def map_file(
    path: str,
    dtype: torch.dtype,
    shape,
    st: os.stat_result | None = None,
    api: str = "",
    sizes: list | None = None,
    mode: str | None = None,
) -> MemoryMappedTensor:
    """Map ``path`` as a tensor of ``dtype`` and ``shape`` (size checked unless ``st`` given).

    With ``sizes`` (component shapes) the file holds the components of a nested tensor
    back to back, and the result is that nested tensor (``shape`` is ignored).
    """
    if sizes is not None:
        shape = (nested_numel(sizes),)
    if type(shape) is not torch.Size:
        shape = torch.Size(shape)
    numel = shape.numel()
    if st is None:
        st = check_file(
            path,
            numel * dtype.itemsize,
            api or "MemoryMappedTensor.from_filename",
            exact=False,
            follow_symlinks=True,
        )
    if numel == 0:
        base = torch.empty(shape, dtype=dtype)
        if sizes is not None:
            base = nested_view(base, "strided", sizes)
        return _wrap(base, path, (st.st_dev, st.st_ino))
    if mode == "r":  # copy-on-write: writes stay in memory
        base = torch.from_file(path, shared=False, size=numel, dtype=dtype)
    elif mode == "r+" and not os.access(path, os.W_OK):
        raise PermissionError(
            f"{api or 'MemoryMappedTensor.from_filename'}: mode='r+' maps {path} shared, "
            "but the file is not writable; pass mode='r' to map it copy-on-write."
        )
    else:
        try:
            base = torch.from_file(path, shared=True, size=numel, dtype=dtype)
        except RuntimeError:
            if mode == "r+" or os.access(path, os.W_OK):
                raise
            # a read-only file: a private (copy-on-write) mapping still reads it
            base = torch.from_file(path, shared=False, size=numel, dtype=dtype)
    if sizes is not None:
        base = nested_view(base, "strided", sizes)
    elif len(shape) != 1:
        base = base.view(shape)
    return _wrap(base, path, (st.st_dev, st.st_ino))


def map_view(
    base: MemoryMappedTensor, offset: int, dtype: torch.dtype, shape
) -> MemoryMappedTensor:
    """The tensor of ``dtype`` and ``shape`` at byte ``offset`` of the byte mapping ``base``."""
    nbytes = math.prod(shape) * dtype.itemsize
    flat = torch.Tensor.narrow(base, 0, offset, nbytes).view(dtype)
    return _wrap(flat.view(shape), base._filename, base._inode)


def _wrap(tensor: torch.Tensor, path: str, inode: tuple) -> MemoryMappedTensor:
    out = torch.Tensor._make_subclass(MemoryMappedTensor, tensor, False)
    out._filename = path
    out._inode = inode
    return out


# ---------------------------------------------------------------------------- the class
class FileHandle:
    """The file behind a ``MemoryMappedTensor``, by name (``MemoryMappedTensor._handler``).

    Example:
        >>> t = MemoryMappedTensor.from_tensor(torch.arange(3))
        >>> MemoryMappedTensor.from_handler(t._handler, torch.int64, (3,)).tolist()
        [0, 1, 2]
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"FileHandle({self.name!r})"


class MemmapFileExistsError(FileExistsError, RuntimeError):
    """A memory-mapped file's target exists and ``existsok`` is ``False``.

    A ``FileExistsError`` (an existing file is an OS-level condition) that is also a
    ``RuntimeError``, the type tensordict raises there, so either ``except`` works.
    """


class MemoryMappedTensor(torch.Tensor):
    """A tensor stored in a file and mapped in memory.

    Build one from a tensor (:meth:`from_tensor`), empty with a shape and a dtype
    (:meth:`empty`, :meth:`zeros`, :meth:`full`, ...), or from an existing file
    (:meth:`from_filename`). Indexing reads only the pages it touches and
    returns a plain tensor (a view of the mapping for basic indexing); in-place
    writes reach the file. Operations return plain tensors.

    ``torch.compile``'s AOT backends (``inductor``, ``aot_eager``) refuse a tensor
    subclass input on a compiled function's first call: pass
    ``t.as_subclass(torch.Tensor)`` (the same mapping, no copy), or ``td.as_tensor()``
    for a container of them.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "x.memmap")
        >>> t = MemoryMappedTensor.from_tensor(torch.arange(6.0).view(2, 3), filename=path)
        >>> t[1] = 0.0
        >>> MemoryMappedTensor.from_filename(path, torch.float32, (2, 3))[1].tolist()
        [0.0, 0.0, 0.0]
        >>> type(t + 1).__name__
        'Tensor'
    """

    # Operations run as on a plain tensor and return plain tensors (like nn.Parameter).
    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    _filename: str
    _inode: tuple

    def __new__(
        cls,
        source: Any = None,
        *,
        dtype: torch.dtype | None = None,
        shape=None,
        index=None,
        device=None,
        handler=None,
        filename=None,
    ):
        """``MemoryMappedTensor(source, ...)``, as in tensordict: dispatches on ``source``.

        A tensor (or what ``torch.as_tensor`` reads: a nested list of numbers, a numpy
        array) is copied to ``filename`` (a temporary file if omitted), a path
        or ``filename=`` is mapped (``dtype`` and ``shape`` needed), a storage
        goes to :meth:`from_storage` and ``handler=`` to :meth:`from_handler`.
        ``index`` then selects a view.
        """
        _check_device(device, "MemoryMappedTensor")
        if handler is not None:
            return cls.from_handler(handler, dtype, shape, index=index)
        if isinstance(source, (torch.UntypedStorage, torch.TypedStorage)):
            return cls.from_storage(source, dtype=dtype, shape=shape, index=index)
        if isinstance(source, (list, tuple)) or type(source).__module__ == "numpy":
            source = torch.as_tensor(source)  # values, as torch.as_tensor reads them
        if isinstance(source, torch.Tensor):
            out = cls.from_tensor(source, filename=filename, shape=shape)
        elif isinstance(source, (str, os.PathLike)) or (source is None and filename is not None):
            path = source if source is not None else filename
            if dtype is None or shape is None:
                raise TypeError(
                    "MemoryMappedTensor: mapping a file needs dtype= and shape=, e.g. "
                    "MemoryMappedTensor(path, dtype=torch.float32, shape=(3, 4))."
                )
            out = cls.from_filename(path, dtype, shape)
        else:
            raise TypeError(
                f"MemoryMappedTensor: expected a tensor, a file name, a storage or handler=, "
                f"got {type(source).__name__}. See MemoryMappedTensor.from_tensor / empty / "
                f"from_filename."
            )
        if dtype is not None and out.dtype != dtype:
            raise ValueError(
                f"MemoryMappedTensor: dtype={dtype} differs from the source's {out.dtype}."
            )
        return out if index is None else out[index]

    def __init__(self, *args, **kwargs) -> None:
        pass  # built by __new__ (torch.Tensor.__init__ takes no arguments)

    @property
    def filename(self) -> str:
        """The absolute path of the file this tensor maps."""
        return self._filename

    @property
    def _handler(self) -> FileHandle:
        """A handle on the file this tensor maps, that :meth:`from_handler` takes (the
        attribute tensordict's memory-mapped tensors have)."""
        return FileHandle(self._filename)

    def __getitem__(self, index) -> Any:
        # A view of the mapping is a MemoryMappedTensor of the same file (tensordict);
        # advanced indexing copies, and gives a plain tensor.
        return self._keep_file(torch.Tensor.__getitem__(self, index))

    def _keep_file(self, out: torch.Tensor) -> Any:
        """``out`` as a ``MemoryMappedTensor`` of this file if it is a view of the mapping.

        Every view keeps the file's name and identity, so that sending it to
        another process sends its place in the file (offset, strides), not a copy
        that torch's own pickling would make (or worse, a detached storage).
        In a traced program (``torch.compile``, ``torch.export``) views are plain
        tensors: a graph holds no file, and reading storage addresses there would
        break the graph.
        """
        if (
            _compiling()
            or not self.numel()
            or out.untyped_storage().data_ptr() != self.untyped_storage().data_ptr()
        ):
            return out
        view = torch.Tensor._make_subclass(MemoryMappedTensor, out, False)
        view._filename = self._filename
        view._inode = self._inode
        return view

    def _is_whole_file(self) -> bool:
        """Whether this tensor's bytes, in order, are the whole mapping (not a view of part of
        it, not a transposed or strided view)."""
        if self.is_nested:
            return (
                int(self._nested_tensor_storage_offsets()[0]) == 0
                and self.numel() * self.element_size() == self.untyped_storage().nbytes()
                and self.is_contiguous()
            )
        return (
            self.storage_offset() == 0
            and self.nbytes == self.untyped_storage().nbytes()
            and self.is_contiguous()
        )

    # -------------------------------------------------------------- constructors
    @classmethod
    def from_tensor(
        cls,
        input: torch.Tensor,
        *,
        filename: str | os.PathLike | None = None,
        existsok: bool = False,
        copy_existing: bool = False,
        copy_data: bool = True,
        shape=None,
    ) -> MemoryMappedTensor:
        """A memory-mapped copy of ``input`` in ``filename`` (a temporary file if omitted).

        Args:
            input: the tensor to copy (any device; gradients are not kept).
            filename: the file to create. Defaults to a file in a temporary
                directory that is removed when the process exits.
            existsok: replace an existing ``filename`` (the old file is replaced
                atomically, so mappings of it keep their content). Defaults to
                ``False``: an existing file is a ``FileExistsError`` (also a ``RuntimeError``).
            copy_existing: allow copying a ``MemoryMappedTensor`` that already
                has another file. Defaults to ``False`` (a ``RuntimeError``), so
                data is not duplicated on disk by mistake.
            copy_data: when ``False``, only the shape and dtype are used and the
                file reads as zeros (it is allocated sparse).
            shape: the shape of the result, when ``input`` must be broadcast.

        A nested tensor is stored as its components back to back and comes back as a
        nested tensor over the file.

        Example:
            >>> t = MemoryMappedTensor.from_tensor(torch.ones(2))
            >>> MemoryMappedTensor.from_tensor(t) is t
            True
        """
        if isinstance(input, MemoryMappedTensor) and input._is_whole_file() and copy_data:
            # (copy_data=False asks for a new, empty file: never the input itself)
            if filename is None or _same_file(input.filename, filename):
                return input
            if not copy_existing:
                raise RuntimeError(
                    f"MemoryMappedTensor.from_tensor: the tensor is already stored in "
                    f"{input.filename}; pass copy_existing=True to copy it to {filename}."
                )
        if not isinstance(input, torch.Tensor):
            raise TypeError(
                f"MemoryMappedTensor.from_tensor: expected a torch.Tensor, got "
                f"{type(input).__name__}. Convert it first (torch.as_tensor)."
            )
        sizes = None
        if input.is_nested:
            sizes = component_sizes(input, shape, "from_tensor")
            input, shape = nested_flat(input), None
        if copy_data:
            check_has_data(input, "MemoryMappedTensor.from_tensor")
        shape = input.shape if shape is None else _size_arg((shape,), "from_tensor")
        if copy_data and input.shape != shape:
            try:
                input = input.expand(shape)
            except RuntimeError:
                raise ValueError(
                    f"MemoryMappedTensor.from_tensor: shape={list(shape)} is not a broadcast of "
                    f"the input's shape {list(input.shape)}; pass a shape the input expands to."
                ) from None

        def fill(fd: int, path: str) -> None:
            if copy_data:
                write_file(fd, path, input, shape)
            else:
                allocate_file(fd, nbytes_of(shape, input.dtype))

        return _create(filename, existsok, input.dtype, shape, fill, "from_tensor", sizes)

    @classmethod
    def empty(
        cls,
        *size,
        shape=None,
        dtype: torch.dtype | None = None,
        device=None,
        filename=None,
        existsok=False,
    ):
        """A new file of ``size`` (or ``shape=``) and ``dtype``; allocated sparse, it reads as 0.

        A 2-D integer tensor as the shape (one row per component) gives a nested tensor
        of those component shapes (``zeros``, ``ones`` and ``full`` too).

        Example:
            >>> MemoryMappedTensor.empty(2, 3, dtype=torch.int64).sum().item()
            0
            >>> MemoryMappedTensor.zeros(shape=(2,), device="cpu").shape
            torch.Size([2])
        """
        _check_device(device, "MemoryMappedTensor.empty")
        return _new_file("empty", size, shape, dtype, None, filename, existsok)

    zeros = empty

    @classmethod
    def full(
        cls, *size, fill_value, shape=None, dtype=None, device=None, filename=None, existsok=False
    ):
        """A new file of ``size`` (or ``shape=``) filled with ``fill_value`` (``-0.0`` too).

        Example:
            >>> MemoryMappedTensor.full(2, fill_value=-0.0).signbit().tolist()
            [True, True]
        """
        _check_device(device, "MemoryMappedTensor.full")
        return _new_file("full", size, shape, dtype, fill_value, filename, existsok)

    @classmethod
    def ones(cls, *size, shape=None, dtype=None, device=None, filename=None, existsok=False):
        """A new file of ``size`` (or ``shape=``) filled with ones."""
        size = _shape_or_size(size, shape, "ones")
        return cls.full(
            *size, fill_value=1, dtype=dtype, device=device, filename=filename, existsok=existsok
        )

    @classmethod
    def empty_like(cls, input: torch.Tensor, *, filename=None, existsok=False):
        return cls.empty(like_shape(input), dtype=input.dtype, filename=filename, existsok=existsok)

    zeros_like = empty_like

    @classmethod
    def ones_like(cls, input: torch.Tensor, *, filename=None, existsok=False):
        return cls.ones(like_shape(input), dtype=input.dtype, filename=filename, existsok=existsok)

    @classmethod
    def full_like(cls, input: torch.Tensor, fill_value, *, filename=None, existsok=False):
        return cls.full(
            like_shape(input),
            fill_value=fill_value,
            dtype=input.dtype,
            filename=filename,
            existsok=existsok,
        )

    @classmethod
    def from_filename(
        cls, filename, dtype: torch.dtype, shape, index=None, mode: str | None = None
    ) -> MemoryMappedTensor:
        """Map an existing file as a tensor of ``dtype`` and ``shape`` (then ``[index]``).

        The file must hold at least the bytes the shape needs (a shorter file is
        a ``ValueError``, never a crash); a longer one is mapped from its start. A 2-D
        integer tensor as ``shape`` (one row per component) maps the file as a nested
        tensor whose components lie back to back.

        ``mode="r"`` maps the file copy-on-write (in-place writes stay in memory);
        ``mode="r+"`` maps it shared (writes reach the file; ``PermissionError`` if it
        is not writable); ``None`` maps it shared when it is writable.

        Example:
            >>> t = MemoryMappedTensor.from_tensor(torch.arange(3))
            >>> x = MemoryMappedTensor.from_filename(t.filename, torch.int64, (3,), mode="r")
            >>> x[0] = 100
            >>> MemoryMappedTensor.from_filename(t.filename, torch.int64, (3,)).tolist()
            [0, 1, 2]
        """
        if mode not in (None, "r", "r+"):
            raise ValueError(
                f"MemoryMappedTensor.from_filename: mode must be None, 'r' or 'r+', got {mode!r}."
            )
        if not isinstance(dtype, torch.dtype):
            raise TypeError(
                f"MemoryMappedTensor.from_filename: dtype must be a torch.dtype, got {dtype!r}."
            )
        sizes = shape_sizes(shape, "from_filename")
        shape = _size_arg((shape,), "from_filename") if sizes is None else None
        out = map_file(os.path.abspath(os.fspath(filename)), dtype, shape, sizes=sizes, mode=mode)
        return out if index is None else out[index]

    @classmethod
    def from_handler(cls, handler, dtype: torch.dtype, shape, index=None) -> MemoryMappedTensor:
        """Map the file behind an open file object or descriptor (``handler``).

        ``handler`` is a file object (``open(...)``, ``tempfile.NamedTemporaryFile()``)
        or a file descriptor; the file is mapped as in :meth:`from_filename`.

        Example:
            >>> import tempfile
            >>> with tempfile.NamedTemporaryFile() as f:
            ...     _ = f.write(torch.arange(4.0).numpy().tobytes()); f.flush()
            ...     MemoryMappedTensor.from_handler(f, torch.float32, (4,))[1:].tolist()
            [1.0, 2.0, 3.0]
        """
        return cls.from_filename(_handler_path(handler), dtype, shape, index=index)

    @classmethod
    def from_storage(
        cls, storage, dtype: torch.dtype | None = None, shape=None, *, index=None, filename=None
    ) -> MemoryMappedTensor:
        """A memory-mapped tensor over a file-backed storage (``UntypedStorage.from_file``).

        ``shape`` may be a 2-D integer tensor (one row per component): the result is then
        the nested tensor whose components lie back to back in the storage.

        Example:
            >>> t = MemoryMappedTensor.from_tensor(torch.arange(6))
            >>> out = MemoryMappedTensor.from_storage(t.untyped_storage(), torch.int64, (2, 3))
            >>> out[1].tolist()
            [3, 4, 5]
        """
        if isinstance(storage, torch.TypedStorage):
            dtype = storage.dtype if dtype is None else dtype
            storage = storage.untyped()
        path = filename if filename is not None else getattr(storage, "filename", None)
        if not path:
            raise ValueError(
                "MemoryMappedTensor.from_storage: the storage is not backed by a file; build "
                "it with torch.UntypedStorage.from_file(path, shared=True, nbytes=...), or "
                "use MemoryMappedTensor.from_tensor to copy the data to a file."
            )
        dtype = torch.get_default_dtype() if dtype is None else dtype
        if shape is None:
            shape = (storage.nbytes() // dtype.itemsize,)
        sizes = shape_sizes(shape, "from_storage")
        if sizes is not None:
            shape = (nested_numel(sizes),)
        shape = _size_arg((shape,), "from_storage")
        if nbytes_of(shape, dtype) > storage.nbytes():
            raise ValueError(
                f"MemoryMappedTensor.from_storage: shape {list(shape)} of {dtype} needs "
                f"{nbytes_of(shape, dtype)} bytes, but the storage holds {storage.nbytes()}."
            )
        base = torch.empty((0,), dtype=dtype).set_(storage, 0, shape)
        if sizes is not None:
            base = nested_view(base, "strided", sizes)
        st = os.stat(path)
        out = torch.Tensor._make_subclass(MemoryMappedTensor, base, False)
        out._filename = os.path.abspath(os.fspath(path))
        out._inode = (st.st_dev, st.st_ino)
        return out if index is None else out[index]

    # -------------------------------------------------------------- python protocols
    def __format__(self, format_spec: str) -> str:
        # torch formats only plain 0-dim tensors by value; its repr formats each element
        # (now a 0-dim MemoryMappedTensor view) with format(): do it by value too
        if self.dim() == 0:
            return self.item().__format__(format_spec)
        return object.__format__(self, format_spec)

    def __deepcopy__(self, memo):
        return self.as_subclass(torch.Tensor).clone()

    def __reduce_ex__(self, protocol):
        # pickle / torch.save store the values as a plain tensor; processes started by
        # multiprocessing get the file itself (see to_process.py).
        return self.as_subclass(torch.Tensor).__reduce_ex__(protocol)


# Methods that return views of their input (of the file, here): each returns a
# MemoryMappedTensor of the same file (see _keep_file). Other operations give plain
# tensors (``__torch_function__`` is disabled: no cost on the hot path). ``detach`` too:
# ``nn.Parameter(mapped)`` relies on it to give a plain tensor, and stays a Parameter.
_VIEW_METHODS = (
    "as_strided", "chunk", "diagonal", "expand", "expand_as", "flatten", "movedim",
    "moveaxis", "narrow", "permute", "reshape", "reshape_as", "select", "split", "squeeze",
    "swapaxes", "swapdims", "t", "tensor_split", "transpose", "unbind", "unflatten", "unfold",
    "unsqueeze", "view", "view_as",
)  # fmt: skip


def _view_method(name: str):
    method = getattr(torch.Tensor, name)

    def view_method(self, *args, **kwargs):
        out = method(self, *args, **kwargs)
        if isinstance(out, torch.Tensor):
            return self._keep_file(out)
        return type(out)(self._keep_file(part) for part in out)

    view_method.__name__ = view_method.__qualname__ = name
    view_method.__doc__ = f"``torch.Tensor.{name}``; views stay ``MemoryMappedTensor``s."
    return view_method


for _name in _VIEW_METHODS:
    setattr(MemoryMappedTensor, _name, _view_method(_name))


def _check_device(device, api: str) -> None:
    if device is not None and torch.device(device).type != "cpu":
        raise ValueError(
            f"{api}: a memory-mapped tensor lives on the CPU, got device={device!r}; move it "
            f"afterwards with .to({str(device)!r})."
        )


def _shape_or_size(size: tuple, shape, api: str) -> tuple:
    if shape is None:
        if not size:  # as torch.empty(): a size is required (shape=() for a 0-d tensor)
            raise TypeError(
                f"MemoryMappedTensor.{api}: missing the size; pass it positionally or as "
                f"shape= (shape=() for a 0-d tensor)."
            )
        return size
    if size:
        raise TypeError(
            f"MemoryMappedTensor.{api}: pass the shape positionally or as shape=, not both."
        )
    return (shape,)


def _handler_path(handler) -> str:
    """The path of the file behind a file object or descriptor."""
    name = getattr(handler, "name", None)
    if isinstance(name, (str, bytes, os.PathLike)) and os.path.exists(name):
        return os.fsdecode(name)
    fd = handler if isinstance(handler, int) else getattr(handler, "fileno", lambda: None)()
    if isinstance(fd, int) and os.path.exists(f"/proc/self/fd/{fd}"):
        target = os.readlink(f"/proc/self/fd/{fd}")
        # an anonymous (deleted) file is reached through its descriptor only
        return target if os.path.exists(target) else f"/proc/self/fd/{fd}"
    raise TypeError(
        f"MemoryMappedTensor.from_handler: expected an open file object or a file descriptor "
        f"of a file on disk, got {type(handler).__name__}."
    )


def _size_arg(size: tuple, api: str) -> torch.Size:
    """``size`` (dims, or one sequence of dims) as a ``torch.Size`` of dims >= 0, or a clear
    error before any file is created."""
    if len(size) == 1 and isinstance(size[0], (list, tuple, torch.Size)):
        size = tuple(size[0])
    try:
        shape = torch.Size(size)
    except TypeError:
        shape = None
    if shape is None or any(type(dim) is not int for dim in shape):
        raise TypeError(
            f"MemoryMappedTensor.{api}: the shape must be integers, got {size!r}; e.g. "
            f"MemoryMappedTensor.{api}(3, 4) or shape=(3, 4)."
        )
    if any(dim < 0 for dim in shape):
        raise ValueError(
            f"MemoryMappedTensor.{api}: the shape {list(shape)} has a negative dim; every dim "
            f"must be >= 0 (a memory-mapped tensor cannot infer a dim from -1)."
        )
    return shape


def _new_file(api, size, shape, dtype, fill_value, filename, existsok) -> MemoryMappedTensor:
    """``empty`` / ``full``: a file of ``shape``, zeros (sparse) or ``fill_value``.

    ``fill_value`` is converted before the file is created (a bad value leaves no
    file); a value whose bytes are not all zero (``-0.0``: its sign bit) is written.
    """
    size = _shape_or_size(size, shape, api)
    sizes = shape_sizes(size[0], api) if len(size) == 1 else None
    shape = _size_arg(size, api) if sizes is None else torch.Size([nested_numel(sizes)])
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"MemoryMappedTensor.{api}: dtype must be a torch.dtype, got {dtype!r}.")
    value = None
    if fill_value is not None:
        try:
            value = torch.full((), fill_value, dtype=dtype)
        except (TypeError, RuntimeError, ValueError) as error:
            raise TypeError(
                f"MemoryMappedTensor.{api}: fill_value={fill_value!r} cannot be stored as "
                f"{dtype}: {error}"
            ) from None
        if not _bytes_of(value).any():
            value = None  # all-zero bytes: the sparse file already reads as this value

    def fill(fd: int, path: str) -> None:
        if value is None:
            allocate_file(fd, nbytes_of(shape, dtype))
        else:
            write_file(fd, path, value, shape)

    return _create(filename, existsok, dtype, shape, fill, api, sizes)


def _same_file(a: str, b) -> bool:
    return os.path.realpath(a) == os.path.realpath(os.fspath(b))


def _create(
    filename, existsok: bool, dtype, shape, fill, api: str, sizes: list | None = None
) -> MemoryMappedTensor:
    """Create a file through ``fill(fd, path)`` at a fresh name, then move it into place.

    Every check that can fail runs before the file exists, and a failure after
    that removes what was written: a constructor that raises leaves no file.
    """
    if filename is None:
        final = temp_path()
    else:
        final = os.path.abspath(os.fspath(filename))
        if os.path.isdir(final):
            raise IsADirectoryError(
                f"MemoryMappedTensor.{api}: filename {final} is a directory; pass the path of "
                f"a file (e.g. {os.path.join(final, 'data.memmap')})."
            )
        if os.path.lexists(final) and not existsok:
            raise MemmapFileExistsError(
                f"MemoryMappedTensor.{api}: {final} already exists; pass existsok=True to "
                f"replace it."
            )
    directory = os.path.dirname(final)
    os.makedirs(directory, exist_ok=True)
    # Written under a temporary name and renamed: existing mappings of ``final``
    # keep their content, and a crash never leaves a half-written ``final``.
    work = os.path.join(directory, f".{uuid.uuid4().hex}.tmp")
    fd = create_file(work)
    try:
        try:
            fill(fd, work)
            st = os.fstat(fd)
        finally:
            os.close(fd)
        os.replace(work, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(work)
        raise
    return map_file(final, dtype, shape, st, sizes=sizes)
