"""A frozen, named total made of parts: the return type of every cost function.

Parts are numbers or nested breakdowns, so the total is always the sum of its parts, and
`flat()` gives `"activations/attention/qkv_input"`-style keys for tables and JSON.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Union

Part = Union[int, float, "Breakdown"]


@dataclass(frozen=True)
class Breakdown:
    unit: str  # "bytes", "params", "s", "flop"
    parts: tuple[tuple[str, Part], ...]

    @classmethod
    def of(cls, unit: str, **parts: Part) -> Breakdown:
        return cls(unit, tuple(parts.items()))

    def __post_init__(self) -> None:
        names = [name for name, _ in self.parts]
        assert len(names) == len(set(names)), f"duplicate part names {names}"
        for name, part in self.parts:
            assert "/" not in name, name
            if isinstance(part, Breakdown):
                assert part.unit == self.unit, (name, part.unit, self.unit)

    @cached_property
    def total(self) -> int | float:
        return sum(_value(part) for _, part in self.parts)

    def __getitem__(self, path: str) -> Part:
        head, _, rest = path.partition("/")
        for name, part in self.parts:
            if name == head:
                if not rest:
                    return part
                assert isinstance(part, Breakdown), path
                return part[rest]
        raise KeyError(path)

    def value(self, path: str) -> int | float:
        return _value(self[path])

    def __iter__(self) -> Iterator[tuple[str, Part]]:
        return iter(self.parts)

    def flat(self, prefix: str = "") -> dict[str, int | float]:
        """Leaves only, keyed by their path."""
        out: dict[str, int | float] = {}
        for name, part in self.parts:
            key = f"{prefix}{name}"
            if isinstance(part, Breakdown):
                out.update(part.flat(key + "/"))
            else:
                out[key] = part
        return out

    def to_json(self) -> dict[str, object]:
        """Nested dict with a `total` at every level."""
        out: dict[str, object] = {"total": self.total}
        for name, part in self.parts:
            out[name] = part.to_json() if isinstance(part, Breakdown) else part
        return out

    def scaled(self, factor: int | float) -> Breakdown:
        return Breakdown(
            self.unit,
            tuple((n, p.scaled(factor) if isinstance(p, Breakdown) else p * factor) for n, p in self.parts),
        )

    def without_zeros(self) -> Breakdown:
        kept = []
        for name, part in self.parts:
            if isinstance(part, Breakdown):
                part = part.without_zeros()
                if part.parts:
                    kept.append((name, part))
            elif part != 0:
                kept.append((name, part))
        return Breakdown(self.unit, tuple(kept))


def _value(part: Part) -> int | float:
    return part.total if isinstance(part, Breakdown) else part
