"""The example model files in models/: published sizes, training step, tracing, kwargs."""

import functools
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

torch.set_num_threads(1)

MODELS_DIR = Path(__file__).resolve().parent.parent / "models"
NAMES = ["gpt", "llama", "resnet", "unet", "mlp"]


@functools.cache
def load(name: str) -> ModuleType:
    """Load models/<name>.py by path, as autopipe does (not registered in sys.modules)."""
    spec = importlib.util.spec_from_file_location(f"_example_model_{name}", MODELS_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def as_args(inputs: Any) -> tuple[Any, ...]:
    return inputs if isinstance(inputs, tuple) else (inputs,)


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # shared (tied) parameters count once


@pytest.mark.parametrize(
    ("name", "kwargs", "published", "rel_tol"),
    [
        ("gpt", {"preset": "gpt2"}, 124_439_808, 0.0),
        ("gpt", {"preset": "gpt2-medium"}, 354_823_168, 0.0),
        ("gpt", {"preset": "gpt2-large"}, 774_030_080, 0.0),
        ("gpt", {"preset": "gpt2-xl"}, 1_557_611_200, 0.0),
        ("gpt", {"preset": "gpt3-175b"}, 175e9, 0.01),  # Brown et al. 2020, Table 2.1
        ("llama", {"preset": "llama2-7b"}, 6_738_415_616, 0.0),
        ("llama", {"preset": "llama2-13b"}, 13_015_864_320, 0.0),
        ("llama", {"preset": "llama2-70b"}, 68_976_648_192, 0.0),
        ("llama", {"preset": "llama3-8b"}, 8_030_261_248, 0.0),  # meta-llama/Meta-Llama-3-8B
        ("llama", {"preset": "llama3-70b"}, 70_553_706_496, 0.0),  # meta-llama/Meta-Llama-3-70B
        ("llama", {"preset": "llama3.1-405b"}, 405_853_388_800, 0.0),  # meta-llama/Llama-3.1-405B
        # Nemotron-4 340B by hand: 96 x (2 h^2 + 2 h 1536 + 2 h 73728 + 2 h) + 2 V h + h, h = 18432
        (
            "llama",
            {"preset": "nemotron4-340b"},
            96 * (2 * 18432**2 + 2 * 18432 * 1536 + 2 * 18432 * 73728 + 2 * 18432) + 2 * 256000 * 18432 + 18432,
            0.0,
        ),
        ("gpt", {"preset": "gpt2", "tie_embeddings": False}, 124_439_808 + 50257 * 768, 0.0),  # the head's own (V, C)
        ("resnet", {"width": 64, "num_classes": 1000, "image_size": 224}, 25_557_032, 0.0),
    ],
)
def test_published_parameter_counts_on_meta(
    name: str, kwargs: dict[str, Any], published: float, rel_tol: float
) -> None:
    with torch.device("meta"):  # a few seconds even for 175B parameters: shapes, no memory
        model = load(name).build_model(**kwargs)
    assert all(p.is_meta for p in model.parameters())
    assert abs(n_params(model) - published) <= rel_tol * published


def test_gpt_lm_head_is_tied_and_llama_is_not() -> None:
    with torch.device("meta"):
        gpt = load("gpt").build_model()
        untied = load("gpt").build_model(tie_embeddings=False)
        llama = load("llama").build_model()
    assert gpt.lm_head.weight is gpt.wte.weight
    assert untied.lm_head.weight is not untied.wte.weight
    assert llama.lm_head.weight is not llama.embed_tokens.weight


def test_llama_squared_relu_mlp_is_two_matrices_and_trains() -> None:
    m = load("llama")
    torch.manual_seed(0)
    model = m.build_model(mlp="relu2", intermediate_size=96)
    mlp = model.layers[0].mlp
    assert [n for n, _ in mlp.named_children()] == ["up_proj", "down_proj"]
    x = torch.randn(2, 3, 128)
    assert torch.allclose(mlp(x), mlp.down_proj(torch.relu(mlp.up_proj(x)) ** 2))
    loss = m.loss_fn(model(m.example_inputs(2)), m.example_targets(2))
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("name", NAMES)
def test_default_model_trains_one_step(name: str) -> None:
    m = load(name)
    torch.manual_seed(0)
    model = m.build_model()
    loss = m.loss_fn(model(*as_args(m.example_inputs(2))), m.example_targets(2))
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert missing == []  # every parameter takes part in the loss


@pytest.mark.parametrize("name", NAMES)
def test_symbolic_trace_matches_eager(name: str) -> None:
    m = load(name)
    torch.manual_seed(0)
    model = m.build_model()
    args = as_args(m.example_inputs(2))
    traced = torch.fx.symbolic_trace(model)
    with torch.no_grad():
        assert (traced(*args) - model(*args)).abs().max().item() <= 1e-5


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "resnet" else n for n in NAMES])
def test_torch_export_matches_eager(name: str) -> None:
    m = load(name)
    torch.manual_seed(0)
    model = m.build_model()
    args = as_args(m.example_inputs(2))
    exported = torch.export.export(model, args, strict=False).module()
    with torch.no_grad():
        assert (exported(*args) - model(*args)).abs().max().item() <= 1e-5


@pytest.mark.parametrize("name", NAMES)
def test_default_model_runs_on_meta(name: str) -> None:
    m = load(name)
    with torch.device("meta"):
        model = m.build_model()
        inputs = m.example_inputs(2)
        targets = m.example_targets(2)
        loss = m.loss_fn(model(*as_args(inputs)), targets)
    assert inputs.is_meta and targets.is_meta and loss.is_meta and loss.dim() == 0


@pytest.mark.parametrize(
    ("name", "kwargs", "input_shape", "target_shape"),
    [
        ("gpt", {"n_layer": 1, "vocab_size": 50, "block_size": 16, "preset": "tiny"}, (3, 16), (3, 16)),
        ("llama", {"n_layer": 1, "n_kv_head": 1, "vocab_size": 50, "block_size": 12}, (3, 12), (3, 12)),
        ("resnet", {"layers": "1,1", "num_classes": 3, "image_size": 32}, (3, 3, 32, 32), (3,)),
        ("unet", {"depth": 2, "out_channels": 2, "image_size": 16}, (3, 3, 16, 16), (3, 2, 16, 16)),
        ("mlp", {"widths": "32,8", "depth": 3, "in_features": 5, "out_features": 2}, (3, 5), (3, 2)),
    ],
)
def test_example_data_follows_the_model_kwargs(
    name: str, kwargs: dict[str, Any], input_shape: tuple[int, ...], target_shape: tuple[int, ...]
) -> None:
    m = load(name)
    inputs, targets = m.example_inputs(3, **kwargs), m.example_targets(3, **kwargs)
    assert tuple(inputs.shape) == input_shape and tuple(targets.shape) == target_shape
    loss = m.loss_fn(m.build_model(**kwargs)(inputs), targets)
    assert loss.dim() == 0 and torch.isfinite(loss)


@pytest.mark.parametrize("name", NAMES)
def test_example_data_is_deterministic(name: str) -> None:
    m = load(name)
    torch.manual_seed(123)  # the global seed must not matter
    first = (m.example_inputs(4), m.example_targets(4))
    torch.manual_seed(456)
    second = (m.example_inputs(4), m.example_targets(4))
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_language_model_targets_are_the_next_tokens(name: str) -> None:
    m = load(name)
    inputs, targets = m.example_inputs(2), m.example_targets(2)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])


@pytest.mark.parametrize("name", NAMES)
def test_unknown_kwarg_raises_type_error(name: str) -> None:
    with pytest.raises(TypeError):
        load(name).build_model(no_such_option=1)


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("gpt", {"preset": "gpt5"}, "unknown preset 'gpt5'"),
        ("gpt", {"n_embd": 100, "n_head": 3}, "multiple of n_head"),
        ("gpt", {"n_layer": "eight"}, "n_layer must be a positive integer"),
        ("gpt", {"dropout": 1.5}, "dropout"),
        ("llama", {"n_head": 4, "n_kv_head": 3}, "n_kv_head must divide n_head"),
        ("llama", {"preset": "llama3"}, "unknown preset"),
        ("llama", {"mlp": "gelu"}, "mlp must be one of swiglu, relu2"),
        ("gpt", {"tie_embeddings": "no"}, "tie_embeddings must be True or False"),
        ("resnet", {"layers": "3,x"}, "comma-separated integers"),
        ("resnet", {"layers": (3, 0)}, "layers must be positive"),
        ("unet", {"image_size": 60}, r"multiple of 2\*\*depth"),
        ("mlp", {"widths": (512, 0)}, "widths must be positive"),
        ("mlp", {"depth": 0}, "depth must be a positive integer"),
    ],
)
def test_bad_values_raise_one_line_value_errors(name: str, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        with torch.device("meta"):
            load(name).build_model(**kwargs)
    assert "\n" not in str(info.value)


def test_explicit_kwargs_override_preset_fields() -> None:
    with torch.device("meta"):
        gpt = load("gpt").build_model(preset="gpt2", n_layer=2)
        llama = load("llama").build_model(preset="llama2-70b", n_layer=3, vocab_size=1000)
    assert len(gpt.blocks) == 2 and gpt.wte.weight.shape == (50257, 768)
    assert len(llama.layers) == 3 and llama.lm_head.weight.shape == (1000, 8192)
    assert llama.layers[0].attn.k_proj.weight.shape == (8 * 128, 8192)  # 8 kv heads of 128


@pytest.mark.parametrize(
    ("kwargs", "ffn_hidden"),
    [
        ({"preset": "llama2-7b"}, 11008),
        ({"preset": "llama2-13b"}, 13824),
        ({"preset": "llama2-70b"}, 28672),
        ({"preset": "tiny"}, 352),  # 8/3 * 128 = 341, rounded up to a multiple of 32
        ({"preset": "llama2-7b", "intermediate_size": 1000}, 1000),
    ],
)
def test_llama_intermediate_size_rule(kwargs: dict[str, Any], ffn_hidden: int) -> None:
    cfg = load("llama").make_config(**kwargs)
    assert cfg.ffn_hidden == ffn_hidden
    with torch.device("meta"):
        model = load("llama").build_model(**kwargs, n_layer=1)
    assert model.layers[0].mlp.gate_proj.weight.shape == (ffn_hidden, cfg.n_embd)


@pytest.mark.parametrize(
    ("widths", "depth", "expected"),
    [
        ("512,2048,256", 4, [512, 2048, 256, 512]),
        ((512, 2048, 256), 2, [512, 2048]),
        ([64, 32], 3, [64, 32, 64]),
        (64, 2, [64, 64]),
        ("(16, 8)", 2, [16, 8]),
    ],
)
def test_mlp_widths_cycle_over_depth(widths: Any, depth: int, expected: list[int]) -> None:
    with torch.device("meta"):
        model = load("mlp").build_model(widths=widths, depth=depth)
    assert [layer.linear.out_features for layer in model.layers] == expected


def test_resnet_stages_follow_layers() -> None:
    with torch.device("meta"):
        model = load("resnet").build_model(layers=(3, 4, 23, 3))
    assert [len(stage) for stage in model.layers] == [3, 4, 23, 3]


def test_unet_decoder_reads_every_encoder_level() -> None:
    model = load("unet").build_model(depth=3)
    graph = torch.fx.symbolic_trace(model).graph
    cats = [n for n in graph.nodes if n.target is torch.cat]
    assert len(cats) == 3  # one long skip per level


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_language_models_are_causal(name: str) -> None:
    m = load(name)
    torch.manual_seed(0)
    model = m.build_model()
    tokens = m.example_inputs(1)
    changed = tokens.clone()
    changed[0, 40] = (changed[0, 40] + 1) % model.config.vocab_size
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert torch.allclose(before[:, :40], after[:, :40], atol=1e-6)  # the past ignores the future
    assert not torch.allclose(before[:, 40:], after[:, 40:])


def test_rotary_scores_depend_only_on_relative_position() -> None:
    llama = load("llama")
    cfg = llama.make_config(block_size=16)
    cos, sin = llama.rotary_tables(cfg)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(cfg.head_dim, generator=g).expand(1, 1, 16, -1)  # the same vector at every position
    k = torch.randn(cfg.head_dim, generator=g).expand(1, 1, 16, -1)
    rq, rk = llama.apply_rotary(q, cos, sin)[0, 0], llama.apply_rotary(k, cos, sin)[0, 0]  # (T, hd)
    scores = rq @ rk.T  # (T, T)
    assert torch.allclose(rq.norm(dim=-1), q[0, 0].norm(dim=-1), atol=1e-5)  # rotations keep norms
    for offset in (-3, 0, 5):
        diagonal = torch.diagonal(scores, offset)
        assert torch.allclose(diagonal, diagonal[0].expand_as(diagonal), atol=1e-4)
    assert not torch.allclose(torch.diagonal(scores, 0)[0], torch.diagonal(scores, 5)[0])
