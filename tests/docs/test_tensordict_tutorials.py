"""tensordict's tutorials give the same results with tdfunc (tensordict_tutorials.py).

Each tutorial runs statement by statement with tensordict 0.15.3 (in its own process,
``tensordict_peer``) and with the import changed to tdfunc (in another), on small
synthetic stand-ins for the datasets it downloads; every statement must print the same
thing and raise the same type of exception. The tutorials are read from tensordict's
repository, which is not part of this one: without it the comparison is skipped (the
tests of the tool itself still run). The differences that remain are listed below with
their reason: a row of docs/differences-from-tensordict.md, or a part of tensordict's
API tdfunc does not have yet. A listed difference that goes away fails the test too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tensordict_examples as examples
import tensordict_peer
import tensordict_tutorials as tutorials

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PAGE = "docs/differences-from-tensordict.md: "

# (tutorial, first line of the statement) -> why it differs
KNOWN: dict[tuple[str, str], str] = {
    ("tensordict_keys", "for key in tensordict.keys(include_nested=True):"): PAGE
    + "keys(include_nested=True) lists a container before its entries",
    ("tensordict_memory", "tensordict.memmap_()"): PAGE
    + "is_shared() is true when every tensor leaf is in shared memory or a file",
    ("tensordict_memory", "print(tensordict)"): PAGE
    + "is_shared() is true when every tensor leaf is in shared memory or a file",
    ("tensorclass_imagenet", "train_data_tc = ImageNetData.from_dataset(train_data_raw)"): PAGE
    + "is_shared() is true when every tensor leaf is in shared memory or a file",
    ("tensorclass_imagenet", "val_data_tc = ImageNetData.from_dataset(val_data)"): PAGE
    + "is_shared() is true when every tensor leaf is in shared memory or a file",
    ("functional", 'print("Output with zeroed params:", y_zero)'): PAGE
    + "inside with td.to_module(m) the module holds the container's tensors as they are",
}


def _statement(source: str) -> str:
    return source.splitlines()[0] if source else source


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tutorials.source_root()
    if root is None:
        pytest.skip(
            f"tensordict's tutorials are not here: set {tutorials.ENV_SOURCE} to the folder "
            "holding them (tutorials/sphinx_tuto of tensordict's repository) or to a clone "
            "of that repository"
        )
    folder = tmp_path_factory.mktemp("tutorials")
    expected, mine = tensordict_peer.recorded_by_both(
        HERE / "tensordict_tutorials.py", folder, str(root), timeout=1800
    )
    return {"tensordict": expected, "tdfunc": mine}


def found_differences(runs) -> dict[tuple[str, str], dict]:
    found = {}
    pairs = zip(runs["tensordict"]["tutorials"], runs["tdfunc"]["tutorials"], strict=True)
    for reference, candidate in pairs:
        for difference in examples.differences(*tutorials.compared(reference, candidate)):
            found[(reference["name"], _statement(difference["source"]))] = difference
    return found


@pytest.mark.slow
def test_every_tutorial_is_found_and_run(runs):
    reference, candidate = runs["tensordict"]["tutorials"], runs["tdfunc"]["tutorials"]
    assert [t["name"] for t in reference] == list(tutorials.TUTORIALS)
    for tutorial, other in zip(reference, candidate, strict=True):
        assert len(other["results"]) == len(tutorial["sources"]), tutorial["name"]
        # with tensordict, every statement that was run and did not depend on one left
        # out ran through (no timeout, no stand-in missing)
        errors = {
            _statement(source): result["error"]
            for source, result in zip(tutorial["sources"], tutorial["results"], strict=True)
            if result["error"] not in (None, "NameError") and not tutorials._lacks_package(result)
        }
        # an assert on what a statement left out would have done may fail
        allowed = {"AssertionError"} if any(tutorial["skip"]) else set()
        assert set(errors.values()) <= allowed, (tutorial["name"], errors)
    compared = [
        tutorials.compared(a, b)[0]["results"] for a, b in zip(reference, candidate, strict=True)
    ]
    assert sum(len(c) for c in compared) > 350


@pytest.mark.slow
def test_tdfunc_prints_and_raises_as_tensordict(runs):
    found = found_differences(runs)
    unexplained = {key: value for key, value in found.items() if key not in KNOWN}
    gone = sorted(key for key in KNOWN if key not in found)
    lines = [
        f"{name}: {statement!r}\n    tensordict: {d['tensordict']}\n    tdfunc:     {d['tdfunc']}"
        for (name, statement), d in sorted(unexplained.items())
    ]
    assert not unexplained, "differences not explained:\n" + "\n".join(lines)
    assert not gone, f"listed differences that no longer occur (remove them): {gone}"


# ---------------------------------------------------------------- the tool itself
SCRIPT = '''"""The page's text."""
import torch

# a comment between statements
x = torch.zeros(2)


@staticmethod
def f():
    return 1


x
if __name__ == "__main__":
    y = 1
# a comment less indented than its block
    for i in range(2):
        print(i)
'''


def test_a_script_is_cut_into_its_statements():
    found = tutorials.statements(SCRIPT)
    assert found == [
        "import torch\n",
        "x = torch.zeros(2)\n",
        "@staticmethod\ndef f():\n    return 1\n",
        "x\n",
        "y = 1\n",
        "for i in range(2):\n    print(i)\n",
    ]
    for source in found:  # each compiles as the prompt runs it
        compile(source, "<tutorial>", "single")


def test_the_sources_are_found_or_the_configured_place_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv(tutorials.ENV_SOURCE, str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match=tutorials.ENV_SOURCE):
        tutorials.source_root()
    monkeypatch.setenv(tutorials.ENV_SOURCE, str(tmp_path))
    assert tutorials.source_root() == tmp_path
    (tmp_path / "tensordict_keys.py").write_text("x = 1\n")
    assert tutorials.read("tensordict_keys", tmp_path) == "x = 1\n"
    with pytest.raises(FileNotFoundError, match="tensordict_shapes"):
        tutorials.read("tensordict_shapes", tmp_path)


def test_statements_outside_tdfunc_are_not_run():
    assert tutorials.skip_reason("from tensordict.nn import TensorDictModule") == (
        "not in tdfunc: tensordict.nn"
    )
    assert tutorials.skip_reason("data = TensorDict.lazy_stack([a, b])") == (
        "not in tdfunc: lazy stacks"
    )
    assert tutorials.skip_reason("print(td._nested_tensor_size())") is not None
    # a device test or a clock is run (its printed numbers are masked instead)
    assert tutorials.skip_reason('device = "cuda" if torch.cuda.is_available() else "cpu"') is None
    assert tutorials.skip_reason("t0 = time.time()") is None


def test_only_the_numbers_a_clock_prints_are_masked():
    out = "loss: 2.30 [ 64/640]\n"
    assert tutorials.mask_timings("print(loss)", out) == out
    assert tutorials.mask_timings('print(f"time: {time.time() - t0}")', "time: 1.5e-3 s\n") == (
        "time: <n> s\n"
    )


def test_statements_a_package_is_missing_for_are_not_compared():
    reference = {
        "sources": ["import matplotlib\n", "x = 1\n", "plot()\n", "td\n"],
        "results": [
            {"out": "", "error": "ModuleNotFoundError", "missing": "matplotlib"},
            {"out": "", "error": None, "skipped": "not in tdfunc: lazy stacks"},
            {"out": "", "error": "NameError"},
            {"out": "a\n", "error": None},
        ],
    }
    candidate = {
        "results": [
            {"out": "", "error": None},
            {"out": "", "error": None, "skipped": "not in tdfunc: lazy stacks"},
            {"out": "", "error": None},
            {"out": "b\n", "error": None},
        ]
    }
    kept, got = tutorials.compared(reference, candidate)
    assert kept["sources"] == ["plot()\n", "td\n"]
    assert [d["source"] for d in examples.differences(kept, got)] == ["td"]


def test_the_synthetic_datasets_have_the_shapes_and_dtypes_of_the_real_ones():
    torchvision = tutorials._synthetic_torchvision()
    to_tensor = torchvision.transforms.ToTensor()
    train = torchvision.datasets.FashionMNIST("data", train=True, transform=to_tensor)
    test = torchvision.datasets.FashionMNIST("data", train=False, transform=to_tensor)
    image, label = train[0]
    assert image.shape == (1, 28, 28) and str(image.dtype) == "torch.float32"
    assert float(image.min()) >= 0 and float(image.max()) <= 1
    assert isinstance(label, int) and 0 <= label < 10
    assert len(train) > len(test) > 64  # more than one batch of the tutorial's 64
    assert not bool((train[0][0] == test[0][0]).all())  # two different sets
    transforms = torchvision.transforms
    raw = torchvision.datasets.ImageFolder(
        "data/train",
        transform=transforms.Compose([transforms.Resize((256, 256)), transforms.PILToTensor()]),
    )
    image, _ = raw[1]
    assert image.shape == (3, 256, 256) and str(image.dtype) == "torch.uint8"
    val = torchvision.datasets.ImageFolder(
        "data/val",
        transform=transforms.Compose(
            [transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor()]
        ),
    )
    assert val[0][0].shape == (3, 224, 224)
    with pytest.raises(IndexError):
        train[len(train)]
