"""Whether a profile belongs to a model: the model traced as the profile was, its fingerprint
and blocks compared (``autopipe plan MODEL --profile FILE``; :func:`autopipe.api.fingerprint_of`).

Tests: tests/cli/test_plan_cmd.py.
"""

from __future__ import annotations

from collections.abc import Mapping

from autopipe.costs.profile import Profile
from autopipe.errors import ProfileError
from autopipe.graph.trace import TracedModel, trace_model
from autopipe.model.load import LoadedModel, load_model

__all__ = ["check_profile_of", "fingerprint_of"]


def check_profile_of(model: str, kwargs: Mapping[str, object], profile_path: str, profile: Profile) -> None:
    """ProfileError unless ``profile`` (read from ``profile_path``) was made from ``model``."""
    loaded = load_model(model, dict(kwargs))
    traced = _traced(loaded, profile)  # as the profile was traced
    have, want = traced.fingerprint(), profile.recipe.fingerprint
    if have != want:
        raise ProfileError(
            f"{profile_path} was made from another model (fingerprint {want}, {model} has {have}); "
            f"profile this model again with 'autopipe profile {model}'"
        )
    profile.check_blocks([(b.name, b.nodes) for b in traced.blocks], profile_path)  # a hand-edited profile


def _traced(loaded: LoadedModel, prof: Profile) -> TracedModel:
    u = min(prof.micro_batch_sizes) if prof.micro_batch_sizes else 1
    return trace_model(
        loaded.model, loaded.make_inputs(u), micro_batch_size=u, recipe=prof.recipe, source=loaded.spec.path
    )


def fingerprint_of(loaded: LoadedModel, prof: Profile) -> str:
    """The fingerprint ``loaded`` gets when traced the way ``prof`` was (to match the two)."""
    return _traced(loaded, prof).fingerprint()
