"""tensordict's docstring examples, run with tensordict and with tdfunc, statement by statement.

The API reference pages users copy from are made of tensordict's docstrings. This tool
finds their ``>>>`` examples with :class:`doctest.DocTestFinder` in tensordict's own
modules, runs each docstring once with tensordict and once with the import changed to
tdfunc, and records, for every statement, what it printed (the ``repr`` an interactive
prompt shows included) and the type of the exception it raised. What tensordict's
docstring says it prints is not used: tensordict's behaviour is the reference.

It is a command line in two halves, each run in its own process (importing tensordict
patches torch, so the tdfunc half never sees it)::

    python tensordict_examples.py reference OUT.json   # extracts and runs, with tensordict
    python tensordict_examples.py tdfunc IN.json OUT.json  # runs the same sources, with tdfunc

Each docstring runs in a fresh namespace that holds ``torch``, ``nn`` and the library's
public names (as tdfunc's own doctests see them), in a fresh working directory, with
torch's, Python's and numpy's random generators seeded.
"""

from __future__ import annotations

import contextlib
import doctest
import importlib
import importlib.util
import io
import json
import os
import random
import re
import signal
import sys
import tempfile
from pathlib import Path

# tensordict's modules whose docstrings are compared (its ``nn``, ``store`` and
# ``prototype`` packages are outside tdfunc's scope).
MODULES = (
    "tensordict",
    "tensordict._archive",
    "tensordict._arrow",
    "tensordict._base.convert",
    "tensordict._base.device",
    "tensordict._base.pointwise",
    "tensordict._base.reductions",
    "tensordict._base.serialization",
    "tensordict._base.shape",
    "tensordict._datasets",
    "tensordict._indexing",
    "tensordict._lazy",
    "tensordict._nestedkey",
    "tensordict._safetensors",
    "tensordict._td",
    "tensordict._tensorcollection",
    "tensordict._unbatched",
    "tensordict.base",
    "tensordict.functional",
    "tensordict.memmap",
    "tensordict.persistent",
    "tensordict.tensorclass",
    "tensordict.typedtensordict",
    "tensordict.utils",
)

# The parts of tensordict that tdfunc leaves out ("Not in tdfunc" on
# docs/differences-from-tensordict.md), found by module or by a name in the example.
OUT_OF_SCOPE_MODULES = {
    "tensordict._lazy": "lazy stacks",
    "tensordict.persistent": "H5 storage",
    "tensordict.typedtensordict": "TypedTensorDict",
    "tensordict._unbatched": "UnbatchedTensor",
}
OUT_OF_SCOPE_NAMES = {
    "LazyStackedTensorDict": "lazy stacks",
    "lazy_stack": "lazy stacks",
    "set_lazy_legacy": "lazy stacks",
    "tensordict.nn": "tensordict.nn",
    "TensorDictModule": "tensordict.nn",
    "TensorDictParams": "tensordict.nn",
    "to_lazystack": "lazy stacks",
    "PersistentTensorDict": "H5 storage",
    "to_store": "Redis storage",
    "h5py": "H5 storage",
    "zarr": "zarr storage",
    "redis": "Redis storage",
    "TypedTensorDict": "TypedTensorDict",
    "UnbatchedTensor": "UnbatchedTensor",
    "MetaData": "MetaData",
}
# Examples that cannot give the same output twice, or that need what a test machine
# lacks, whichever library runs them.
UNREPEATABLE_NAMES = {
    "cuda": "needs a CUDA device",
    "StreamingDataset": "needs the mosaicml-streaming package and its data",
    "timeit": "prints timings",
    "time.time": "prints timings",
}
# A private module of tensordict, or a private method called (``td._transform_keys(...)``):
# not part of the API a user copies.
_PRIVATE = re.compile(r"\bfrom\s+tensordict\._|\w\._[a-z]\w*\(")
TIMEOUT_S = 60
# Optional packages some examples need (tensordict raises ImportError without them),
# and how to recognise those examples.
OPTIONAL_PACKAGES = {
    "pandas": r"\bpandas\b|\bpd\.|_csv\(|_pandas\(",
    "pyarrow": r"\bpyarrow\b|_parquet\(|_arrow\(",
    "safetensors": r"safetensors",
    "h5py": r"_h5\(|\bh5py\b",
}


def skip_reason(module: str, source: str) -> str | None:
    """Why a docstring's examples are not compared, or None when they are."""
    if module in OUT_OF_SCOPE_MODULES:
        return "not in tdfunc: " + OUT_OF_SCOPE_MODULES[module]
    for name, reason in OUT_OF_SCOPE_NAMES.items():
        if re.search(rf"\b{re.escape(name)}\b", source):
            return "not in tdfunc: " + reason
    if _PRIVATE.search(source):
        return "uses a private name of tensordict"
    for name, reason in UNREPEATABLE_NAMES.items():
        if re.search(rf"\b{re.escape(name)}\b", source):
            return reason
    return None


# ---------------------------------------------------------------- extraction
def extract(modules=MODULES) -> list[dict]:
    """Every docstring with examples in ``modules``, once each (with tensordict imported)."""
    finder = doctest.DocTestFinder(exclude_empty=True)
    found, seen = [], set()
    for module_name in modules:
        module = importlib.import_module(module_name)
        for test in sorted(finder.find(module), key=lambda test: test.name):
            if not test.examples or (test.filename, test.lineno) in seen:
                continue
            seen.add((test.filename, test.lineno))
            sources = [example.source for example in test.examples]
            found.append(
                {
                    "module": module_name,
                    "name": test.name,
                    "sources": sources,
                    "skip": skip_reason(module_name, "".join(sources)),
                }
            )
    return found


# ---------------------------------------------------------------- import change
def to_tdfunc(source: str) -> str:
    """``source`` with tensordict's imports changed to tdfunc's.

    A public submodule tdfunc also has (``tensordict.utils``, ``tensordict.functional``)
    keeps its name; tdfunc exports the other submodules' public names at the top level.
    """

    def module(path: str) -> str:
        parts = path.split(".")
        if len(parts) > 1 and importlib.util.find_spec("tdfunc." + parts[1]) is not None:
            return "tdfunc." + ".".join(parts[1:])
        return "tdfunc"

    source = re.sub(
        r"^(\s*from\s+)(tensordict(?:\.\w+)*)(\s+import\b)",
        lambda match: match[1] + module(match[2]) + match[3],
        source,
        flags=re.MULTILINE,
    )
    source = re.sub(r"^(\s*import\s+)tensordict\b", r"\1tdfunc as tensordict", source, flags=re.M)
    return source


# ---------------------------------------------------------------- running
class _Timeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise _Timeout


def _namespace(library) -> dict:
    import torch
    from torch import nn

    names = {name: getattr(library, name) for name in dir(library) if not name.startswith("_")}
    names.update(torch=torch, nn=nn, __name__="__main__")
    return names


def _seed() -> None:
    import torch

    torch.manual_seed(0)
    random.seed(0)
    with contextlib.suppress(ImportError):
        import numpy

        numpy.random.seed(0)


def _options(library) -> dict:
    utils = importlib.import_module(library.__name__ + ".utils")
    return {
        "print": library.get_printoptions(),
        "list_to_stack": utils.list_to_stack(),
        "capture_non_tensor_stack": utils.capture_non_tensor_stack(),
    }


def _restore_options(library, options: dict) -> None:
    """Undo what an example set for the rest of the program (``set_printoptions(...).set()``)."""
    utils = importlib.import_module(library.__name__ + ".utils")
    library.set_printoptions(**options["print"]).set()
    utils.set_list_to_stack(options["list_to_stack"]).set()
    utils.set_capture_non_tensor_stack(options["capture_non_tensor_stack"]).set()


@contextlib.contextmanager
def session(library, timeout: int = TIMEOUT_S):
    """A fresh working directory, seeded generators and an alarm after ``timeout`` seconds;
    the library's global options restored afterwards."""
    options = _options(library)
    previous = os.getcwd()
    old_handler = signal.signal(signal.SIGALRM, _on_alarm)
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)
        _seed()
        signal.alarm(timeout)
        try:
            yield
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old_handler)
            os.chdir(previous)
            _restore_options(library, options)


def run_statement(source: str, namespace: dict, rewrite) -> dict:
    """Run one statement as an interactive prompt does (an expression's ``repr`` is
    printed); what it printed and the exception it raised."""
    printed, error, missing, caught_as = io.StringIO(), None, None, []
    try:
        code = compile(rewrite(source), "<example>", "single")
        with contextlib.redirect_stdout(printed):
            exec(code, namespace)
    except _Timeout:
        error = "Timeout"
    except Exception as caught:
        error = type(caught).__name__
        caught_as = [cls.__name__ for cls in type(caught).__mro__]
        if isinstance(caught, ModuleNotFoundError):
            missing = (caught.name or "").partition(".")[0]
    return {"out": printed.getvalue(), "error": error, "missing": missing, "caught_as": caught_as}


def run_docstring(sources: list[str], library, rewrite) -> list[dict]:
    """Run one docstring's statements in order; what each printed and raised."""
    namespace = _namespace(library)
    results = []
    with session(library):
        for source in sources:
            results.append(run_statement(source, namespace, rewrite))
            if results[-1]["error"] == "Timeout":
                break
    return results


def run_all(docstrings: list[dict], library_name: str) -> list[dict]:
    library = importlib.import_module(library_name)
    rewrite = to_tdfunc if library_name == "tdfunc" else (lambda source: source)
    for docstring in docstrings:
        if docstring["skip"] is None:
            docstring["results"] = run_docstring(docstring["sources"], library, rewrite)
    return docstrings


def _unavailable() -> list[str]:
    return [name for name in OPTIONAL_PACKAGES if importlib.util.find_spec(name) is None]


def main(argv: list[str]) -> None:
    import warnings

    warnings.simplefilter("ignore")
    if argv[0] == "reference":
        # tensordict 0.15.3 prints a compact form by default; its documentation pages
        # (and tdfunc) print the detailed one, compared here for every example.
        importlib.import_module("tensordict").set_printoptions(compact=False).set()
        docstrings = run_all(extract(), "tensordict")
        version = importlib.import_module("tensordict").__version__
        data = {"version": version, "unavailable": _unavailable(), "docstrings": docstrings}
        Path(argv[1]).write_text(json.dumps(data))
    elif argv[0] == "tdfunc":
        data = json.loads(Path(argv[1]).read_text())
        reference = data["docstrings"]
        for docstring in reference:
            docstring.pop("results", None)
        data["docstrings"] = run_all(reference, "tdfunc")
        data["unavailable"] = _unavailable()
        Path(argv[2]).write_text(json.dumps(data))
    else:
        raise SystemExit(f"usage: {sys.argv[0]} reference OUT.json | tdfunc IN.json OUT.json")


if __name__ == "__main__":
    main(sys.argv[1:])


# ---------------------------------------------------------------- comparison
# Printing that differs in what no user reads: where a class is defined, memory
# addresses, and the random part of temporary directory names.
_NOISE = (
    (re.compile(r"<class '(?:tensordict|tdfunc)(?:\.\w+)*\.(\w+)'>"), r"<class '\1'>"),
    (re.compile(r"\b0x[0-9a-f]{6,}\b"), "0x..."),
    (re.compile(r"\btmp[\w]{8}\b"), "tmp..."),
)


def normalise(text: str) -> str:
    for pattern, replacement in _NOISE:
        text = pattern.sub(replacement, text)
    return text


def missing_package(docstring: dict, unavailable: list[str]) -> str | None:
    """A third-party package the run lacked (the example cannot be compared)."""
    for result in docstring.get("results", ()):
        if result.get("missing") and result["missing"] not in ("tensordict", "tdfunc"):
            return result["missing"]
    source = "".join(docstring["sources"])
    for package in unavailable:
        if re.search(OPTIONAL_PACKAGES[package], source):
            return package
    return None


def _same_error(expected: dict, got: dict) -> bool:
    """Whether code catching tensordict's exception catches tdfunc's (the same class, or
    one that derives from a class of that name, as tdfunc's errors that are both a
    ``ValueError`` and tensordict's ``RuntimeError``)."""
    if expected["error"] is None or got["error"] is None:
        return expected["error"] == got["error"]
    return expected["error"] in got.get("caught_as", [got["error"]])


def differences(reference: dict, candidate: dict) -> list[dict]:
    """The statements of one docstring whose printing or exception type differ.

    Not compared: a statement that fails with ``NameError`` with tensordict (the example
    uses a name it never defines), and, after a first difference, one that fails with
    ``NameError`` with tdfunc only (a name the differing statement did not define).
    """
    found = []
    for source, expected, got in zip(
        reference["sources"], reference["results"], candidate["results"], strict=False
    ):
        if expected["error"] == "NameError" or (found and got["error"] == "NameError"):
            continue
        if not _same_error(expected, got) or normalise(expected["out"]) != normalise(got["out"]):
            found.append({"source": source.strip(), "tensordict": expected, "tdfunc": got})
    if len(candidate["results"]) != len(reference["results"]):
        found.append({"source": "<the run stopped early>", "tensordict": {}, "tdfunc": {}})
    return found
