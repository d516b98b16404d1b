"""Mistake rates of a noisy scripted expert: the one base class every environment's expert uses."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict


class MistakeRates(BaseModel):
    """Probabilities of an expert's mistake kinds (all 0: the exact expert).

    A subclass declares one ``float`` field per mistake kind
    (``Field(0.0, ge=0, le=1, description=...)``); the expert draws which
    mistakes an episode makes from them.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def uniform(cls, p: float) -> Self:
        """Every mistake with probability ``p``."""
        return cls(**dict.fromkeys(cls.model_fields, p))

    @classmethod
    def coerce(cls, noise: float | Self) -> Self:
        """``noise`` as it is, or a probability made into :meth:`uniform` rates."""
        return noise if isinstance(noise, cls) else cls.uniform(noise)

    def label(self) -> str:
        """``expert``, ``noisy(p)`` when all rates equal p, else ``noisy(custom)``."""
        rates = set(self.model_dump().values())
        if rates == {0.0}:
            return "expert"
        return f"noisy({rates.pop():g})" if len(rates) == 1 else "noisy(custom)"
