"""``ConformanceSuite``: a pytest-collectable base class; subclass it and set ``core``."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from .checks import CHECKS, CoreCase, Skip, case_from_registry


def _make_test(check_name: str) -> Any:
    def test(self: ConformanceSuite) -> None:
        try:
            CHECKS[check_name](self.conformance_case())
        except Skip as exc:
            pytest.skip(str(exc))

    test.__name__ = f"test_{check_name}"
    test.__doc__ = CHECKS[check_name].__doc__
    return test


class ConformanceSuite:
    """Inherit every conformance check. Set ``core`` (a registered name) and optionally
    ``preset``/``d_model``, or override ``make_case`` to return a ``CoreCase`` directly."""

    core: ClassVar[str | None] = None
    preset: ClassVar[str] = "tiny"
    d_model: ClassVar[int] = 5
    _case: ClassVar[CoreCase | None] = None

    def make_case(self) -> CoreCase:
        if self.core is None:
            raise TypeError(f"{type(self).__name__} must set `core = '<registered name>'` or override make_case()")
        return case_from_registry(self.core, preset=self.preset, d_model=self.d_model)

    def conformance_case(self) -> CoreCase:
        cls = type(self)
        case: CoreCase | None = cls.__dict__.get("_case")  # this class's own, not a parent suite's
        if case is None:
            case = cls._case = self.make_case()
        return case


for _name in CHECKS:
    setattr(ConformanceSuite, f"test_{_name}", _make_test(_name))
