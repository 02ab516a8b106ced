"""The batches of a run: the model file's ``train_data``, else its ``example_inputs``.

``train_data(batch_size)`` (optional in the model-file convention) returns an iterable of
``(inputs, targets)`` batches -- a list, a generator, a ``DataLoader`` (its lists ``[x, y]``
count as pairs). Every rank iterates it the same way: it is called after
``torch.manual_seed(seed)`` and always runs on its own copy of torch's CPU RNG state, so a
shuffling loader draws the same order on every rank whatever the model draws in between
(dropout). When it ends it is called again (cycling; said once), continuing that RNG, so a
shuffling loader reshuffles.

Without ``train_data``, step ``k`` seeds the global RNG with ``seed + k + 1`` and calls
``example_inputs(batch_size)`` / ``example_targets(batch_size)``: a file that draws from the
global RNG gets a new batch each step, one with its own fixed generator the same batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from autopipe.errors import ModelLoadError
from autopipe.model.load import LoadedModel
from autopipe.model.usercode import guarded

__all__ = ["Batch", "BatchSource"]

Batch = tuple[Any, Any]  # inputs as the model takes them, and targets (None without targets)


_END = object()  # the iterator is exhausted


def _next(it: Iterator[Any], what: str, path: Path) -> Any:
    """``next(it)`` (user code: a generator, a DataLoader) under the guard and its time limit, so a
    first batch that never comes is one line; ``_END`` when it is exhausted."""
    with guarded(what, path):
        try:
            return next(it)
        except StopIteration:
            return _END


class BatchSource:
    """Step ``k``'s batch, :meth:`batch` called with ``k`` = 0, 1, 2, ... (skipping ahead is fine)."""

    def __init__(
        self, loaded: LoadedModel, batch_size: int, seed: int, note: Callable[[str], None] = lambda _: None
    ) -> None:
        self.loaded, self.batch_size, self.seed, self.note = loaded, batch_size, seed, note
        self.kind = "train_data" if loaded.make_train_data is not None else "example_inputs"
        self._it: Iterator[Any] | None = None
        self._state = torch.Tensor()
        self._next_step = 0  # the step of the batch the iterator yields next
        self._in_epoch = 0  # batches of the current pass over train_data
        if self.kind == "train_data":
            note(f"training on train_data() from {loaded.spec.path}")
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                self._start()

    def batch(self, k: int) -> Batch:
        if self.kind == "example_inputs":
            torch.manual_seed(self.seed + k + 1)
            B, make_targets = self.batch_size, self.loaded.make_targets
            return self.loaded.make_inputs(B), make_targets(B) if make_targets is not None else None
        if k < self._next_step:
            raise ModelLoadError(
                f"internal error: batch {k} asked for after batch {self._next_step - 1}; please report this"
            )
        while True:
            item = self._pull()
            self._next_step += 1
            if self._next_step > k:
                return item

    def _start(self) -> None:
        make = self.loaded.make_train_data
        assert make is not None
        data = make(self.batch_size)
        with guarded(f"train_data({self.batch_size})", self.loaded.spec.path):
            self._it = iter(data)
        self._in_epoch = 0
        self._state = torch.get_rng_state()

    def _pull(self) -> Batch:
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self._state)
            assert self._it is not None
            item = _next(self._it, f"batch {self._next_step} of train_data()", self.loaded.spec.path)
            if item is _END:
                if self._in_epoch == 0:
                    raise ModelLoadError(
                        f"train_data({self.batch_size}) in {self.loaded.spec.path} yielded no batches; "
                        "yield at least one (inputs, targets) pair"
                    )
                if self._next_step == self._in_epoch:
                    self.note(f"train_data() ended after {self._in_epoch} batches; starting it again (cycling)")
                self._start()
                return self._pull()
            self._in_epoch += 1
            self._state = torch.get_rng_state()
        return self._check(item)

    def _check(self, item: Any) -> Batch:
        where = f"batch {self._next_step} of train_data() in {self.loaded.spec.path}"
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ModelLoadError(
                f"{where} is a {type(item).__name__}; yield (inputs, targets) pairs (targets None "
                "when loss_fn takes only the output)"
            )
        inputs, targets = item
        for what, value in (("inputs", inputs), ("targets", targets)):
            leaves = [t for t in torch.utils._pytree.tree_leaves(value) if isinstance(t, torch.Tensor) and t.dim() > 0]
            if leaves and leaves[0].shape[0] != self.batch_size:
                raise ModelLoadError(
                    f"{where} has {leaves[0].shape[0]} samples in its {what}, the plan's batch size "
                    f"is {self.batch_size}; "
                    "yield batches of batch_size (a DataLoader: drop_last=True)"
                )
        return inputs, targets
