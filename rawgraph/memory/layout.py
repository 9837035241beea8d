"""Layout: named, aligned regions carved from one address range (pure bookkeeping)."""

from __future__ import annotations

from dataclasses import dataclass


class ArenaFullError(MemoryError):
    """A region does not fit; the message gives the sizes asked for and available."""


@dataclass(frozen=True)
class Region:
    """A named byte range [offset, offset + nbytes) of an arena."""

    name: str
    offset: int
    nbytes: int


def align_up(n: int, align: int) -> int:
    """n rounded up to a multiple of align (a power of two)."""
    if align <= 0 or align & (align - 1):
        raise ValueError(f"alignment {align} must be a power of two")
    return (n + align - 1) & ~(align - 1)


class Layout:
    """A bump allocator of named regions over `capacity` bytes; regions never move."""

    def __init__(self, capacity: int, name: str = "arena"):
        if capacity <= 0:
            raise ValueError(f"{name}: capacity must be positive, got {capacity}")
        self.capacity, self.name = capacity, name
        self.regions: dict[str, Region] = {}
        self.top = 0

    def reserve(self, name: str, nbytes: int, align: int = 256) -> Region:
        """Carve `nbytes` (aligned) named `name`; raises ArenaFullError if it does not fit."""
        if name in self.regions:
            raise ValueError(f"{self.name}: region {name!r} already exists")
        if nbytes <= 0:
            raise ValueError(f"{self.name}: region {name!r} needs a positive size, got {nbytes}")
        offset = align_up(self.top, align)
        if offset + nbytes > self.capacity:
            raise ArenaFullError(
                f"{self.name}: region {name!r} needs {nbytes:,} bytes (at alignment {align}) but "
                f"only {max(self.capacity - offset, 0):,} of {self.capacity:,} are free; "
                f"in use: {self.summary()}")
        self.regions[name] = r = Region(name, offset, nbytes)
        self.top = offset + nbytes
        return r

    @property
    def used(self) -> int:
        """Bytes up to the end of the last region (padding included)."""
        return self.top

    def stats(self) -> dict[str, int]:
        """Bytes per region, plus 'free' and 'capacity'."""
        out = {r.name: r.nbytes for r in self.regions.values()}
        out["free"] = self.capacity - self.top
        out["capacity"] = self.capacity
        return out

    def summary(self) -> str:
        """'name=bytes, ...' of the regions."""
        return ", ".join(f"{r.name}={r.nbytes:,}" for r in self.regions.values()) or "nothing"

    def find(self, offset: int) -> Region | None:
        """The region containing byte `offset`, if any."""
        for r in self.regions.values():
            if r.offset <= offset < r.offset + r.nbytes:
                return r
        return None
