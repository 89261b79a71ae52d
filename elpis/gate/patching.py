"""Swap or observe a function of a model's code at run time, wherever a module imported it by name.

`elpis.reference.model` does `from elpis.reference.layers import attend`, so replacing `layers.attend`
alone would not reach it: every loaded module under the given package whose attribute *is* the original
function gets the replacement, and everything is put back on exit (also after an exception).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch


@contextmanager
def replaced(package: str, replacements: Mapping[Callable, Callable]) -> Iterator[None]:
    """Within the block, calls to each original function under `package` go to its replacement."""
    undo: list[tuple[Any, str, Callable]] = []
    try:
        for name, module in list(sys.modules.items()):
            if module is None or not (name == package or name.startswith(package + ".")):
                continue
            for attr, value in list(vars(module).items()):
                for original, replacement in replacements.items():
                    if value is original:
                        setattr(module, attr, replacement)
                        undo.append((module, attr, original))
        missing = [fn.__name__ for fn in replacements if not any(orig is fn for _, _, orig in undo)]
        if missing:
            raise RuntimeError(f"no module under {package} uses {missing}: nothing to replace")
        yield
    finally:
        for module, attr, original in reversed(undo):
            setattr(module, attr, original)


@contextmanager
def recorded(package: str, functions: Mapping[str, Callable]) -> Iterator[dict[str, list[tuple]]]:
    """Record (detached copies of) the positional arguments of every call to the named functions."""
    calls: dict[str, list[tuple]] = {name: [] for name in functions}

    def recorder(name: str, fn: Callable) -> Callable:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name].append(tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args))
            return fn(*args, **kwargs)

        return wrapper

    with replaced(package, {fn: recorder(name, fn) for name, fn in functions.items()}):
        yield calls
