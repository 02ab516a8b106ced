"""``autopipe.plan`` and ``autopipe plan`` ask the planner the same request for the same
inputs: every default (devices, memory, link, cost per action, bytes per parameter) is
decided in :mod:`autopipe.planner.defaults`."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
from autopipe.cli.main import main

import autopipe
import autopipe.api
from autopipe.costs.analytic import state_factor
from autopipe.costs.devices import device_spec
from autopipe.costs.profile import Affine, BlockCost, Profile, TensorCost
from autopipe.graph.recipe import TraceRecipe
from autopipe.planner.defaults import (
    default_devices,
    default_dtype,
    default_link,
    device_memory,
    parallel_request,
    plan_micro_batch_sizes,
    plan_request,
)
from autopipe.planner.request import Link, PlanRequest
from autopipe.units import parse_bytes, parse_duration, parse_rate

MIB = 2.0**20


def block(i: int, bytes_per_param: int) -> BlockCost:
    return BlockCost(
        name=f"layers.{i}",
        nodes=(f"n{i}",),
        params=1000,
        param_bytes=1000 * bytes_per_param,
        forward_s=Affine(1e-5, 1e-3),
        backward_s=Affine(2e-5, 2e-3),
        backward_input_s=Affine(1e-5, 1e-3),
        backward_weight_s=Affine(1e-5, 1e-3),
        saved_bytes=Affine(0.0, MIB),
    )


def chain(n: int = 8, method: str = "measured", bytes_per_param: int = 4, device: str = "cpu (1 threads)") -> Profile:
    blocks = tuple(block(i, bytes_per_param) for i in range(n))
    links = tuple(TensorCost(f"n{i}", i, (i + 1,), Affine(0.0, MIB)) for i in range(n - 1))
    tensors = (TensorCost("x", -1, (0,), Affine(0.0, 64.0)), *links)
    return Profile(
        model="chain",
        recipe=TraceRecipe(tracer="fx", fingerprint="fp"),
        device=device,
        torch_version=torch.__version__,
        dtype="float32",
        micro_batch_sizes=(1, 2),
        method=method,
        blocks=blocks,
        tensors=tensors,
    )


class Asked(Exception):
    """Raised by the stand-in planner: the request it was asked, and nothing planned."""

    def __init__(self, request: PlanRequest) -> None:
        super().__init__("asked")
        self.request = request


def _stop(profile: Profile, request: PlanRequest, progress: object = None) -> object:
    raise Asked(request)


def asked_by_api(monkeypatch: pytest.MonkeyPatch, profile: Profile, **kw: object) -> PlanRequest:
    monkeypatch.setattr(autopipe.api, "plan_pipeline", _stop)
    with pytest.raises(Asked) as info:
        autopipe.plan(torch.nn.Linear(2, 2), torch.zeros(4, 2), profile_data=profile, **kw)  # type: ignore[arg-type]
    return info.value.request


def asked_by_cli(monkeypatch: pytest.MonkeyPatch, profile: Profile, tmp_path: Path, *flags: str) -> PlanRequest:
    monkeypatch.setattr(autopipe.api, "plan_pipeline", _stop)  # the CLI plans through the API
    path = tmp_path / "profile.json"
    profile.save(path)
    with pytest.raises(Asked) as info:
        main(["plan", "--profile", str(path), "-o", str(tmp_path / "plan.json"), *flags])
    return info.value.request


def test_nothing_given_the_api_and_the_cli_take_the_same_defaults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    profile = chain()
    api = asked_by_api(monkeypatch, profile, batch_size=32)
    cli = asked_by_cli(monkeypatch, profile, tmp_path, "--batch-size", "32")
    assert api == cli
    assert api.devices == default_devices() and api.memory_limit == device_memory(profile.device)
    assert (api.link_bandwidth, api.link_latency_s) == default_link(profile.device)
    assert api.action_overhead_s == 1.5e-4 and api.send_overhead_s == 4.5e-4  # bench_overhead, quiet (issue 28)
    assert api.state_factor == PlanRequest.state_factor


def test_everything_given_the_api_and_the_cli_ask_the_same(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    profile = chain()
    api = asked_by_api(
        monkeypatch,
        profile,
        stages=2,
        memory="3GiB",
        batch_size=16,
        choices=autopipe.Choices(micro_batches=4, schedule="1f1b", virtual=None, recompute=autopipe.Recompute.NEVER),
        link=autopipe.Link(parse_rate("25GB/s"), parse_duration("20us"), parse_duration("0.1ms")),
    )
    cli = asked_by_cli(
        monkeypatch,
        profile,
        tmp_path,
        "--stages",
        "2",
        "--memory",
        "3GiB",
        "--batch-size",
        "16",
        "--micro-batches",
        "4",
        "--schedule",
        "1f1b",
        "--no-recompute",
        "--bandwidth",
        "25GB/s",
        "--latency",
        "20us",
        "--action-overhead",
        "0.1ms",
    )
    assert api == cli
    assert (api.devices, api.memory_limit, api.micro_batches, api.recompute) == (2, parse_bytes("3GiB"), 4, "never")


def test_an_analytic_profile_keeps_16_bytes_per_parameter_in_both(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # bf16 weights (2 bytes a parameter): weights, grads, fp32 master and Adam moments = 16 bytes.
    profile = chain(method="analytic", bytes_per_param=2, device="h100")
    api = asked_by_api(monkeypatch, profile, stages=2, memory="80GB", batch_size=8)
    cli = asked_by_cli(monkeypatch, profile, tmp_path, "--stages", "2", "--memory", "80GB", "--batch-size", "8")
    assert api == cli
    assert api.state_factor == state_factor(profile) == 8.0
    assert (api.link_bandwidth, api.link_latency_s) == default_link(profile.device)


def test_a_catalogue_device_gives_its_memory_and_links() -> None:
    h100 = device_spec("h100")
    req = plan_request(chain(), devices=2, batch_size=8, memory_limit=None, device=h100)
    assert req.memory_limit == h100.memory_bytes
    assert (req.link_bandwidth, req.link_latency_s) == (h100.nvlink_bandwidth, h100.link_latency_s)
    mine = plan_request(chain(), devices=2, batch_size=8, memory_limit=2.0**30, link=Link(1e9, 0.0), device=h100)
    assert (mine.memory_limit, mine.link_bandwidth, mine.link_latency_s) == (2.0**30, 1e9, 0.0)
    assert default_dtype(h100) == "bf16" and default_dtype(dataclasses.replace(h100, name="cpu")) == "fp32"


def test_device_defaults_without_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_devices() == 4
    assert device_memory("cpu (1 threads)") == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@pytest.mark.parametrize(
    ("batch", "available", "sizes"), [(32, None, (2, 4, 8)), (32, 4, (1, 2, 4)), (6, None, (1, 3, 6)), (1, None, (1,))]
)
def test_plan_micro_batch_sizes(batch: int, available: int | None, sizes: tuple[int, ...]) -> None:
    assert plan_micro_batch_sizes(batch, available) == sizes


def test_parallel_request_defaults() -> None:
    profile = chain(device="cuda: a GPU not in the catalogue")
    req = parallel_request(profile, gpus=8, batch_size=64, memory_limit=2.0**34, device=None)
    bw, lat = default_link("cuda")
    assert (
        req.cluster.devices,
        req.cluster.nvlink_bandwidth,
        req.cluster.network_bandwidth,
        req.cluster.link_latency_s,
    ) == (8, bw, bw, lat)
    assert req.bytes_per_param == PlanRequest.state_factor * 4 and req.action_overhead_s == 0.0
    slow = parallel_request(profile, gpus=8, batch_size=64, memory_limit=2.0**30, link=Link(bandwidth=1e9), device=None)
    assert (slow.cluster.nvlink_bandwidth, slow.cluster.network_bandwidth, slow.memory_limit) == (1e9, 1e9, 2.0**30)


def test_the_profiles_measured_executor_costs_are_the_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A profile that measured the executor (issue 28) is priced at its figures; a flag or a
    Link still wins; a GPU profile without them costs nothing per action or send."""
    from autopipe.costs.profile import ExecutorCost

    measured = dataclasses.replace(chain(), executor=ExecutorCost(1e-4, 6e-4, 0.1, 0.2, measured=True))
    api = asked_by_api(monkeypatch, measured, batch_size=32)
    assert (api.action_overhead_s, api.send_overhead_s) == (1e-4, 6e-4)
    assert asked_by_cli(monkeypatch, measured, tmp_path, "--batch-size", "32") == api
    given = asked_by_cli(monkeypatch, measured, tmp_path, "--batch-size", "32", "--send-overhead", "0.2ms")
    assert (given.action_overhead_s, given.send_overhead_s) == (1e-4, pytest.approx(2e-4))
    linked = asked_by_api(monkeypatch, measured, batch_size=32, link=autopipe.Link(action_overhead_s=0.0))
    assert (linked.action_overhead_s, linked.send_overhead_s) == (0.0, 6e-4)
    gpu = plan_request(chain(device="cuda: NVIDIA H100"), devices=2, batch_size=8, memory_limit=2.0**30)
    assert (gpu.action_overhead_s, gpu.send_overhead_s) == (0.0, 0.0)
