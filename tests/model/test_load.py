"""Loading a user's model file: factories, example data, and one clear line for every mistake."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

from autopipe.errors import ModelLoadError
from autopipe.model.load import (
    LoadedModel,
    call_model,
    check_model_runs,
    default_loss,
    describe_inputs,
    load_model,
)

torch.set_num_threads(1)

FIXTURES = Path(__file__).parents[1] / "fixtures"


def line_of(path: Path, marker: str) -> int:
    """1-based line number of the first line of ``path`` containing ``marker``."""
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        if marker in line:
            return i
    raise AssertionError(f"{marker!r} not in {path}")


def load_error(spec: str, kwargs: dict[str, object] | None = None, **kw: object) -> str:
    with pytest.raises(ModelLoadError) as info:
        loaded = load_model(spec, kwargs, **kw)  # type: ignore[arg-type]
        check_model_runs(loaded, 2)
    message = str(info.value)
    assert "\n" not in message, message
    assert "Traceback" not in message
    return message


def write(tmp_path: Path, name: str, source: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(source))
    return p


GOOD_TAIL = """
import torch

def example_inputs(batch_size):
    return torch.randn(batch_size, 4)
"""


def test_good_model_loads_and_runs() -> None:
    loaded = load_model(str(FIXTURES / "good_mlp.py"), {"width": 8, "depth": 3})
    assert isinstance(loaded, LoadedModel)
    assert len(loaded.model.layers) == 3  # type: ignore[arg-type]
    x = loaded.make_inputs(5)
    assert isinstance(x, torch.Tensor) and x.shape == (5, 8)  # width bound from the kwargs
    assert loaded.has_targets and loaded.make_targets is not None
    y = loaded.make_targets(5)
    loss = loaded.loss_fn(call_model(loaded.model, x), y)
    assert loss.shape == () and loss.requires_grad
    check_model_runs(loaded, 5)


def test_named_factory_and_meta_device() -> None:
    loaded = load_model(f"{FIXTURES / 'good_mlp.py'}:build_shallow", device="meta")
    assert loaded.spec.factory == "build_shallow"
    assert all(p.is_meta for p in loaded.model.parameters())
    x = loaded.make_inputs(3)
    assert isinstance(x, torch.Tensor) and x.is_meta
    check_model_runs(loaded, 3)


def test_loading_twice_gives_independent_modules() -> None:
    a = load_model(str(FIXTURES / "good_mlp.py"))
    b = load_model(str(FIXTURES / "good_mlp.py"))
    assert type(a.model) is not type(b.model)
    assert type(a.model).__module__ in sys.modules


def test_defaults_without_targets_or_loss(tmp_path: Path) -> None:
    p = write(tmp_path, "plain.py", "def build_model():\n    return torch.nn.Linear(4, 3)\n" + GOOD_TAIL)
    loaded = load_model(str(p))
    assert not loaded.has_targets and loaded.make_targets is None
    assert loaded.loss_fn is default_loss
    check_model_runs(loaded, 2)


def test_sibling_import_and_sys_path_restored(tmp_path: Path) -> None:
    write(tmp_path, "blocks_sibling_xyz.py", "import torch\nclass Block(torch.nn.Linear):\n    pass\n")
    p = write(
        tmp_path,
        "uses_sibling.py",
        "from blocks_sibling_xyz import Block\ndef build_model():\n    return Block(4, 4)\n" + GOOD_TAIL,
    )
    before = list(sys.path)
    loaded = load_model(str(p))
    assert sys.path == before
    check_model_runs(loaded, 2)
    sys.modules.pop("blocks_sibling_xyz", None)


def test_sys_path_restored_after_failure() -> None:
    before = list(sys.path)
    load_error(str(FIXTURES / "imports_missing.py"))
    load_error(str(FIXTURES / "raises_in_build.py"), {"n_layer": 3})
    assert sys.path == before


def test_missing_file() -> None:
    msg = load_error("tests/fixtures/missing.py")
    assert msg.startswith("model file not found: tests/fixtures/missing.py")


def test_directory_and_not_python(tmp_path: Path) -> None:
    assert "is a directory" in load_error(str(tmp_path))
    txt = tmp_path / "model.txt"
    txt.write_text("x = 1\n")
    assert "model.txt is not a Python file" in load_error(str(txt))


def test_syntax_error() -> None:
    msg = load_error("tests/fixtures/bad_syntax.py")
    assert msg.startswith("syntax error in tests/fixtures/bad_syntax.py:7: ")


def test_import_error() -> None:
    path = FIXTURES / "imports_missing.py"
    msg = load_error("tests/fixtures/imports_missing.py")
    assert "ModuleNotFoundError: No module named 'autopipe_no_such_package_xyz'" in msg
    assert f"tests/fixtures/imports_missing.py:{line_of(path, 'import-line')}" in msg


def test_no_factory() -> None:
    msg = load_error("tests/fixtures/no_factory.py")
    assert msg == (
        "tests/fixtures/no_factory.py has no function 'build_model'; define build_model(**kwargs) -> nn.Module "
        "or name another with tests/fixtures/no_factory.py:factory"
    )
    load_model("tests/fixtures/no_factory.py:make_net")  # naming the factory fixes it


def test_factory_raises_names_innermost_user_line() -> None:
    path = FIXTURES / "raises_in_build.py"
    msg = load_error("tests/fixtures/raises_in_build.py", {"n_layer": 3})
    assert msg == (
        "build_model raised ValueError: n_layer must be at most 2, got 3 "
        f"(tests/fixtures/raises_in_build.py:{line_of(path, 'raise-line')})"
    )


def test_model_rejects_inputs() -> None:
    path = FIXTURES / "rejects_inputs.py"
    msg = load_error("tests/fixtures/rejects_inputs.py")
    assert msg.startswith("the model rejected its example inputs (input shapes: (2, 64) int64): RuntimeError: ")
    assert msg.endswith(f"(tests/fixtures/rejects_inputs.py:{line_of(path, 'reject-line')})")


@pytest.mark.parametrize(
    ("kwargs", "parts"),
    [
        (
            {"widht": 4},
            ["build_model() does not take widht", "(it takes: width, depth, n_classes)", "did you mean -k width"],
        ),
        ({"width": 4, "zzz": 1}, ["does not take zzz"]),
    ],
)
def test_factory_rejects_kwargs(kwargs: dict[str, object], parts: list[str]) -> None:
    msg = load_error(str(FIXTURES / "good_mlp.py"), kwargs)
    for part in parts:
        assert part in msg


@pytest.mark.parametrize(
    ("source", "kwargs", "parts"),
    [
        (
            "def build_model(n_layer):\n    return torch.nn.Linear(4, 4)\n",
            {},
            ["build_model() needs n_layer", "-k n_layer=VALUE"],
        ),
        (
            "def build_model():\n    return torch.nn.Linear(4, 4)\n",
            {"n": 1},
            ["does not take n (it takes: no arguments)"],
        ),
        ("build_model = 3\n", {}, ["build_model in", "is a int, not a function"]),
        (
            "def build_model():\n    return {'a': 1}\n",
            {},
            ["build_model() in", "returned a dict, not a torch.nn.Module"],
        ),
        ("def build_model(**kw):\n    return torch.nn.Linear(4, 4)\n", {"anything": 1}, None),
    ],
)
def test_factory_problems(tmp_path: Path, source: str, kwargs: dict[str, object], parts: list[str] | None) -> None:
    p = write(tmp_path, "m.py", "import torch\n" + source + GOOD_TAIL)
    if parts is None:
        check_model_runs(load_model(str(p), kwargs), 2)
        return
    msg = load_error(str(p), kwargs)
    for part in parts:
        assert part in msg, msg


def test_no_example_inputs(tmp_path: Path) -> None:
    p = write(tmp_path, "m.py", "import torch\ndef build_model():\n    return torch.nn.Linear(4, 4)\n")
    assert "has no function 'example_inputs'" in load_error(str(p))


@pytest.mark.parametrize(
    ("body", "parts"),
    [
        (
            "def example_inputs(batch_size):\n    raise KeyError('seq_len')\n",
            ["example_inputs(2) raised KeyError: 'seq_len' (", "m.py:5)"],
        ),
        ("def example_inputs(batch_size):\n    return None\n", ["example_inputs(2) in", "returned None"]),
        (
            "def example_inputs(batch_size):\n    return torch.randn(batch_size, 4)\n"
            "def loss_fn(out, tgt):\n    raise RuntimeError('bad\\nsecond line')\n",
            ["loss_fn raised RuntimeError: bad (", "m.py:7)"],
        ),
        (
            "def example_inputs(batch_size):\n    return torch.randn(batch_size, 4)\n"
            "def loss_fn(out, tgt):\n    return out\n",
            ["loss_fn returned a tensor of shape (2, 4), not a scalar"],
        ),
        (
            "def example_inputs(batch_size):\n    return torch.randn(batch_size, 4)\n"
            "def loss_fn(out, tgt):\n    return 1.0\n",
            ["returned a float, not a Tensor"],
        ),
    ],
)
def test_user_function_problems(tmp_path: Path, body: str, parts: list[str]) -> None:
    p = write(tmp_path, "m.py", "import torch\ndef build_model():\n    return torch.nn.Linear(4, 4)\n" + body)
    msg = load_error(str(p))
    for part in parts:
        assert part in msg, msg


def test_module_level_error(tmp_path: Path) -> None:
    p = write(tmp_path, "m.py", "import torch\nx = 1\nraise ValueError('no GPU here')\n")
    msg = load_error(str(p))
    assert msg.startswith(f"importing {p} raised ValueError: no GPU here (")
    assert msg.endswith("m.py:3)")


def test_bad_batch_size() -> None:
    loaded = load_model(str(FIXTURES / "good_mlp.py"))
    with pytest.raises(ModelLoadError, match="positive integer"):
        loaded.make_inputs(0)


def test_call_model_and_describe() -> None:
    def f(*args: object, **kwargs: object) -> tuple[tuple[object, ...], dict[str, object]]:
        return args, kwargs

    t = torch.zeros(8, 64, dtype=torch.long)
    assert call_model(f, t) == ((t,), {})
    assert call_model(f, (t, 1)) == ((t, 1), {})
    assert call_model(f, {"a": t}) == ((), {"a": t})
    assert describe_inputs(t) == "(8, 64) int64"
    assert describe_inputs((t, torch.ones(3))) == "(8, 64) int64, (3,) float32"
    assert describe_inputs({"ids": t, "n": 3}) == "ids: (8, 64) int64, n: int"


def test_default_loss() -> None:
    a, b = torch.full((2, 3), 2.0), torch.full((4,), 5.0)
    assert default_loss(a).item() == 2.0
    assert default_loss({"logits": a, "aux": (b, torch.ones(2, dtype=torch.long))}).item() == 7.0
    with pytest.raises(ModelLoadError, match="define loss_fn"):
        default_loss(torch.ones(2, dtype=torch.long))


def test_error_in_sibling_module_names_its_line(tmp_path: Path) -> None:
    write(
        tmp_path,
        "layers_sibling_abc.py",
        "import torch\nclass Bad(torch.nn.Module):\n    def forward(self, x):\n"
        "        raise RuntimeError('shape mismatch')\n",
    )
    p = write(
        tmp_path, "net.py", "from layers_sibling_abc import Bad\ndef build_model():\n    return Bad()\n" + GOOD_TAIL
    )
    try:
        msg = load_error(str(p), device="cpu")
    finally:
        sys.modules.pop("layers_sibling_abc", None)
    assert msg.startswith(
        "the model rejected its example inputs (input shapes: (2, 4) float32): RuntimeError: shape mismatch ("
    )
    assert msg.endswith("layers_sibling_abc.py:4)")


GOOD = """
import sys
import torch

def build_model():
    return torch.nn.Linear(4, 2)

def example_inputs(batch_size):
    return torch.randn(batch_size, 4)
"""


def test_binary_model_file(tmp_path: Path) -> None:
    binary = tmp_path / "binary.py"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\xff\xfe")
    assert load_error(str(binary)) == (
        f"{binary} is not Python source (a binary file?); "
        "a model file is a .py file defining build_model() and example_inputs()"
    )
    latin = tmp_path / "latin.py"
    latin.write_bytes(b"x = '\xff\xfe'\n")
    assert load_error(str(latin)) == (
        f"syntax error in {latin}:1: (unicode error) "
        "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"
    )


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda s: "import sys\nsys.exit(5)\n" + s,
            "{path} called sys.exit(5) ({path}:2) while being imported; a model file must not exit",
        ),
        (
            lambda s: s.replace("return torch.nn.Linear(4, 2)", "sys.exit(5)"),
            "build_model in {path} called sys.exit(5) ({path}:6); return or raise instead of exiting",
        ),
        (
            lambda s: s.replace("return torch.randn(batch_size, 4)", "sys.exit()"),
            "example_inputs(2) in {path} called sys.exit() ({path}:9); return or raise instead of exiting",
        ),
        (
            lambda s: s.replace("torch.randn(batch_size, 4)", "torch.randn(8, 4)"),
            "example_inputs(2) in {path} returned a tensor of shape (8, 4), "
            "whose first dimension is not the batch size 2; "
            "make example_inputs use its batch_size argument",
        ),
        (
            lambda s: s.replace(
                "torch.randn(batch_size, 4)", "(torch.randn(batch_size, 4), {'mask': torch.ones(3, 4)})"
            ),
            "example_inputs(2) in {path} returned a tensor of shape (3, 4), "
            "whose first dimension is not the batch size 2; "
            "make example_inputs use its batch_size argument",
        ),
    ],
)
def test_user_code_that_exits_or_ignores_the_batch_size(tmp_path: Path, edit: object, message: str) -> None:
    path = tmp_path / "model.py"
    path.write_text(edit(GOOD))  # type: ignore[operator]
    assert load_error(str(path)) == message.format(path=path)


def test_sys_exit_from_a_model_file_is_exit_2_in_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from autopipe.cli.main import main

    path = tmp_path / "model.py"
    path.write_text("import sys\nsys.exit(5)\n" + GOOD)
    assert main(["profile", str(path), "-o", str(tmp_path / "p.json")]) == 2
    assert (
        capsys.readouterr().err
        == f"autopipe: error: {path} called sys.exit(5) ({path}:2) while being imported; a model file must not exit\n"
    )
