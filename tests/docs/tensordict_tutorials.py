"""tensordict's tutorials, run with tensordict and with tdfunc, statement by statement.

A tutorial is a script: its top-level statements (and those of an
``if __name__ == "__main__":`` block) run in order in one namespace, once with tensordict
and once with the import changed to tdfunc (``tensordict_examples.to_tdfunc``), each in
its own process. For every statement the run records what it printed (the ``repr`` of an
expression included) and the type of the exception it raised, as the docstring harness
does; ``tensordict_examples.differences`` compares the two runs.

The tutorials' text is not part of this repository: it is read from
``$TDFUNC_TENSORDICT_TUTORIALS`` (a folder holding the tutorials' ``.py`` files, or a
clone of tensordict's repository, read at ``HEAD``), by default from the mirror named
in :data:`DEFAULT_SOURCE` when it exists. ::

    python tensordict_tutorials.py reference OUT.json        # with tensordict
    python tensordict_tutorials.py tdfunc IN.json OUT.json   # the same statements, with tdfunc

What a test machine lacks is replaced the same way for both libraries: the datasets the
tutorials download (``torchvision``'s FashionMNIST and ImageFolder, with its transforms)
by small synthetic ones of the same shapes and dtypes, and ``tqdm`` by a silent progress
bar. A statement that uses a part of tensordict outside tdfunc's scope is not run.
Timings are not compared: the numbers a statement prints are masked when its source
mentions a clock.
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import tensordict_examples as examples

ENV_SOURCE = "TDFUNC_TENSORDICT_TUTORIALS"
DEFAULT_SOURCE = Path("/work/.mirror/pytorch+tensordict/repo")
FOLDER_IN_REPOSITORY = "tutorials/sphinx_tuto"
TUTORIALS = (
    "tensordict_keys",
    "tensordict_shapes",
    "tensordict_slicing",
    "tensordict_memory",
    "tensordict_preallocation",
    "data_fashion",
    "tensorclass_fashion",
    "tensorclass_imagenet",
    "streamed_tensordict",
    "functional",
    "export",
    "serialization_speed",
    "zarr_storage",
    "tensordict_module",
)
TIMEOUT_S = 300
# Sizes a shared test machine can run in seconds (the same for both libraries): the
# tutorials' knobs where they have one, their constants otherwise.
ENVIRONMENT = {"NUM_WORKERS": "0"}
SHRINK = {
    "serialization_speed": ((r"\bN_REPEATS = 32\b", "N_REPEATS = 2"), (r"2\*\*(20|17)", "2**10")),
}
_CLOCK = re.compile(r"\btime\b|perf_counter|\bTimer\b|\basyncio\b")
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")
_ADDRESS = re.compile(r"\b0x[0-9a-f]{6,}\b")


# ---------------------------------------------------------------- sources
def source_root() -> Path | None:
    """Where the tutorials are read from, or None when there is no such place.

    A folder named in ``$TDFUNC_TENSORDICT_TUTORIALS`` must exist: a configured
    comparison never skips silently.
    """
    configured = os.environ.get(ENV_SOURCE)
    if configured:
        if not Path(configured).is_dir():
            raise FileNotFoundError(
                f"{ENV_SOURCE}={configured} is not a folder: name the folder holding "
                "tensordict's tutorials or a clone of tensordict's repository"
            )
        return Path(configured)
    return DEFAULT_SOURCE if DEFAULT_SOURCE.is_dir() else None


def read(name: str, root: Path) -> str:
    """The text of tutorial ``name`` from a folder of tutorials or a repository."""
    if (root / f"{name}.py").is_file():
        return (root / f"{name}.py").read_text()
    shown = subprocess.run(
        ["git", "-C", str(root), "show", f"HEAD:{FOLDER_IN_REPOSITORY}/{name}.py"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if shown.returncode != 0:
        raise FileNotFoundError(
            f"tutorial {name!r}: neither {root / (name + '.py')} nor "
            f"{FOLDER_IN_REPOSITORY}/{name}.py in the repository at {root} "
            f"({shown.stderr.strip()[:200]})"
        )
    return shown.stdout


def statements(text: str) -> list[str]:
    """The script's statements in order, each as its own source text; the body of an
    ``if __name__ == "__main__":`` block counts as top level (a script runs it)."""
    lines = text.splitlines(keepends=True)
    found = []

    def walk(body):
        for node in body:
            if (
                isinstance(node, ast.If)
                and not node.orelse
                and ast.unparse(node.test).replace("'", '"') == '__name__ == "__main__"'
            ):
                walk(node.body)
                continue
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # the page's text
            start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
            found.append(
                "".join(
                    _outdent(line, node.col_offset) for line in lines[start - 1 : node.end_lineno]
                )
            )

    walk(ast.parse(text).body)
    return found


def _outdent(line: str, column: int) -> str:
    """``line`` moved ``column`` characters left (a comment or a blank line less indented
    than its block just loses its indent)."""
    return line[column:] if line[:column].isspace() or not column else line.lstrip(" \t")


def skip_reason(source: str) -> str | None:
    """Why a statement is not run with either library, or None."""
    reason = examples.skip_reason("tutorial", source)
    if reason and (reason.startswith("not in tdfunc") or "private" in reason):
        return reason
    return None


def extract(root: Path) -> list[dict]:
    found = []
    for name in TUTORIALS:
        sources = statements(read(name, root))
        for pattern, replacement in SHRINK.get(name, ()):
            sources = [re.sub(pattern, replacement, source) for source in sources]
        found.append({"name": name, "sources": sources, "skip": [skip_reason(s) for s in sources]})
    return found


# ---------------------------------------------------------------- stand-ins
def _synthetic_torchvision() -> types.ModuleType:
    """``torchvision.datasets`` and ``transforms`` as far as the tutorials use them: an
    "image" is a uint8 tensor [3, H, W] (PIL's role), made from the index."""
    import torch
    import torch.nn.functional as F

    def resize(image, size):
        size = (size, size) if isinstance(size, int) else tuple(size)
        return F.interpolate(image[None].float(), size=size)[0].to(image.dtype)

    def center_crop(image, size):
        top, left = (image.shape[-2] - size) // 2, (image.shape[-1] - size) // 2
        return image[..., top : top + size, left : left + size]

    transforms = types.ModuleType("torchvision.transforms")

    def compose(steps):
        def run(image):
            for step in steps:
                image = step(image)
            return image

        return run

    transforms.Compose = compose
    transforms.ToTensor = lambda: lambda image: image.float() / 255
    transforms.PILToTensor = lambda: lambda image: image
    transforms.Resize = lambda size: lambda image: resize(image, size)
    transforms.CenterCrop = lambda size: lambda image: center_crop(image, size)
    transforms.RandomResizedCrop = lambda size: lambda image: resize(image, size)
    transforms.RandomHorizontalFlip = lambda: lambda image: image.flip(-1)
    transforms.Normalize = lambda mean, std: (
        lambda image: (image - torch.tensor(mean).view(-1, 1, 1)) / torch.tensor(std).view(-1, 1, 1)
    )

    class Images(torch.utils.data.Dataset):
        def __init__(self, count, channels, side, classes, seed, transform):
            self.count, self.shape = count, (channels, side, side)
            self.classes, self.seed, self.transform = classes, seed, transform

        def __len__(self):
            return self.count

        def __getitem__(self, index):
            if not 0 <= index < self.count:
                raise IndexError(index)
            generator = torch.Generator().manual_seed(self.seed * 100_003 + index)
            image = torch.randint(0, 256, self.shape, dtype=torch.uint8, generator=generator)
            target = int(torch.randint(self.classes, (), generator=generator))
            return (self.transform(image) if self.transform else image), target

    datasets = types.ModuleType("torchvision.datasets")
    datasets.FashionMNIST = lambda root, train=True, download=False, transform=None: Images(
        640 if train else 320, 1, 28, 10, int(train), transform
    )
    datasets.ImageFolder = lambda root, transform=None: Images(
        40, 3, 256, 2, 2 + (Path(root).name == "train"), transform
    )
    torchvision = types.ModuleType("torchvision")
    torchvision.datasets, torchvision.transforms = datasets, transforms
    return torchvision


def _silent_tqdm() -> types.ModuleType:
    class Bar:
        def __init__(self, *args, **kwargs):
            pass

        def update(self, count=1):
            pass

        def close(self):
            pass

    tqdm = types.ModuleType("tqdm")
    tqdm.tqdm = Bar
    return tqdm


def install_stand_ins() -> None:
    torchvision = _synthetic_torchvision()
    modules = {
        "torchvision": torchvision,
        "torchvision.datasets": torchvision.datasets,
        "torchvision.transforms": torchvision.transforms,
        "tqdm": _silent_tqdm(),
    }
    for name, module in modules.items():
        # torch looks modules up with importlib.util.find_spec, which wants a spec
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    sys.modules.update(modules)
    os.environ.update(ENVIRONMENT)


# ---------------------------------------------------------------- running
def mask_timings(source: str, out: str) -> str:
    # addresses first: masking their digits would leave a different pattern per run
    return _NUMBER.sub("<n>", _ADDRESS.sub("0x...", out)) if _CLOCK.search(source) else out


def run_tutorial(tutorial: dict, library, rewrite) -> list[dict]:
    namespace = {"__name__": "__main__"}
    results = []
    with examples.session(library, TIMEOUT_S):
        for source, skip in zip(tutorial["sources"], tutorial["skip"], strict=True):
            if skip:
                results.append({"out": "", "error": None, "skipped": skip})
                continue
            result = examples.run_statement(source, namespace, rewrite)
            result["out"] = mask_timings(source, result["out"])
            results.append(result)
            if result["error"] == "Timeout":
                break
    return results


def run_all(tutorials: list[dict], library_name: str) -> list[dict]:
    library = importlib.import_module(library_name)
    rewrite = examples.to_tdfunc if library_name == "tdfunc" else (lambda source: source)
    for tutorial in tutorials:
        tutorial["results"] = run_tutorial(tutorial, library, rewrite)
    return tutorials


def main(argv: list[str]) -> None:
    import warnings

    warnings.simplefilter("ignore")
    install_stand_ins()
    if argv[0] == "reference":
        root = Path(argv[2]) if len(argv) > 2 else source_root()
        if root is None:
            raise SystemExit(f"no tutorials: set {ENV_SOURCE} to their folder")
        library = importlib.import_module("tensordict")
        library.set_printoptions(compact=False).set()  # the form tdfunc prints
        data = {"version": library.__version__, "tutorials": run_all(extract(root), "tensordict")}
        Path(argv[1]).write_text(json.dumps(data))
    elif argv[0] == "tdfunc":
        data = json.loads(Path(argv[1]).read_text())
        for tutorial in data["tutorials"]:
            tutorial.pop("results", None)
        data["tutorials"] = run_all(data["tutorials"], "tdfunc")
        Path(argv[2]).write_text(json.dumps(data))
    else:
        raise SystemExit(
            f"usage: {sys.argv[0]} reference OUT.json [FOLDER] | tdfunc IN.json OUT.json"
        )


if __name__ == "__main__":
    main(sys.argv[1:])


# ---------------------------------------------------------------- comparison
def _lacks_package(result: dict) -> bool:
    return bool(result.get("missing")) and result["missing"] not in ("tensordict", "tdfunc")


def compared(reference: dict, candidate: dict) -> tuple[dict, dict]:
    """The two runs of a tutorial in the form ``tensordict_examples.differences`` takes,
    without the statements that were not run and those that need a package one of the
    two environments lacks (``matplotlib`` for a plot)."""
    got = candidate["results"]
    kept = [
        i
        for i, result in enumerate(reference["results"])
        if not result.get("skipped")
        and not _lacks_package(result)
        and not (i < len(got) and _lacks_package(got[i]))
    ]
    return (
        {
            "sources": [reference["sources"][i] for i in kept],
            "results": [reference["results"][i] for i in kept],
        },
        {"results": [got[i] for i in kept if i < len(got)]},
    )
