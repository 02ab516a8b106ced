"""How to build a model again and trace it into the same blocks: one :class:`TraceRecipe`.

A Profile and the Plan made from it carry the recipe of the model they describe, so that
``autopipe emit``, ``run`` and ``calibrate`` rebuild that model and trace it into the blocks
the costs and the cuts refer to. It is plain data (no torch), written into profile and plan
JSON as one ``"recipe"`` object::

    TraceRecipe(model_file="models/gpt.py", factory="build_model", model_kwargs=("n_layer=4",),
                tracer="fx", leaf_modules=(), max_blocks=None, fingerprint="3f0c9a1e5b7d2c44")

Three parts: which model (``model_file``, ``factory``, ``model_kwargs``: a
:class:`~autopipe.model.spec.ModelSpec` in words), how to trace it (``tracer``,
``leaf_modules``, ``max_blocks``: what :func:`autopipe.graph.trace.trace_model` reads), and
what the trace came to (``fingerprint``), which whoever traces again checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from autopipe.model.spec import DEFAULT_FACTORY, ModelSpec, parse_kwargs

__all__ = ["DEFAULT_RECIPE", "TraceRecipe"]


@dataclass(frozen=True)
class TraceRecipe:
    """How to rebuild a model (file, factory, kwargs) and re-trace it (tracer, leaves, blocks)."""

    model_file: str = ""  # path of the model file as given ("" when the model came from Python)
    factory: str = DEFAULT_FACTORY  # the function in it that builds the model
    model_kwargs: tuple[str, ...] = ()  # the factory's kwargs as "key=value" words, as given with -k
    tracer: str = "auto"  # "auto", "fx" or "export"; once traced, the one that worked
    leaf_modules: tuple[str, ...] = ()  # module classes kept whole inside one block (--leaf)
    max_blocks: int | None = None  # target number of blocks (--blocks); None: about one per layer
    fingerprint: str = ""  # what the trace hashes to (TracedModel.fingerprint); "" before tracing

    def __post_init__(self) -> None:
        # Callers hand over lists (argparse, JSON); a recipe holds tuples so it hashes and compares.
        object.__setattr__(self, "model_kwargs", tuple(self.model_kwargs))
        object.__setattr__(self, "leaf_modules", tuple(self.leaf_modules))

    def model_spec(self) -> ModelSpec:
        """Which model to build: the file, its factory and the parsed kwargs."""
        return ModelSpec(Path(self.model_file), self.factory, parse_kwargs(self.model_kwargs))

    def traced(self, spec: ModelSpec, tracer: str, fingerprint: str) -> TraceRecipe:
        """This recipe as followed for ``spec``: its model, the tracer that worked, the fingerprint."""
        return replace(
            self,
            model_file=str(spec.path),
            factory=spec.factory,
            model_kwargs=spec.kwarg_items(),
            tracer=tracer,
            fingerprint=fingerprint,
        )

    def to_dict(self) -> dict[str, Any]:
        """The recipe as a JSON object (tuples become lists when dumped)."""
        return asdict(self)

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> TraceRecipe:
        """Read :meth:`to_dict`'s object; also the same keys at the top level of a version 1
        plan or profile. ``fingerprint`` is required; a recipe written without ``tracer`` is from
        before ``torch.export`` support, so ``fx``. Raises KeyError, TypeError or ValueError."""
        max_blocks = raw.get("max_blocks")
        return TraceRecipe(
            model_file=str(raw.get("model_file", "")),
            factory=str(raw.get("factory", DEFAULT_FACTORY)),
            model_kwargs=tuple(str(k) for k in raw.get("model_kwargs", ())),
            tracer=str(raw.get("tracer", "fx")),
            leaf_modules=tuple(str(k) for k in raw.get("leaf_modules", ())),
            max_blocks=None if max_blocks is None else int(max_blocks),
            fingerprint=str(raw["fingerprint"]),
        )


DEFAULT_RECIPE = TraceRecipe()  # tracer auto, no leaf modules, about one block per layer
