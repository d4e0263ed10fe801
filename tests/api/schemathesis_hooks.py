"""Schemathesis hooks of ``test_openapi_fuzz.py`` (``SCHEMATHESIS_HOOKS``): a budget in proportion to the input space.

The coverage phase sends one request per value of every enum: ``data_timezone`` of
``POST /training`` names about 600 zones, half of all the requests of a run, each read
the same way (a zone of the enum; the request then goes on to its files). The fuzzer
sees a sample of them: the first and last, the zones with names of their own (UTC, the
GMT aliases), every tenth. A zone outside the sample is still valid to the service; it is
never sent as an invalid one (the negative values are strings far from any zone name).
"""

from __future__ import annotations

from typing import Any

import schemathesis

KEPT = ("UTC", "Etc/UTC", "Etc/GMT+0", "Etc/GMT-0", "Etc/GMT+12", "Etc/GMT-14")
EVERY = 10
LONG_ENUM = 50


def sample(values: list[Any]) -> list[Any]:
    """Every EVERY-th value, the last, and those in KEPT, in the enum's order."""
    return [v for k, v in enumerate(values) if k % EVERY == 0 or k == len(values) - 1 or v in KEPT]


@schemathesis.hook
def before_load_schema(context: Any, raw_schema: dict[str, Any]) -> None:
    zone = raw_schema["components"]["schemas"]["TrainingRequest"]["properties"]["data_timezone"]
    for branch in zone.get("anyOf", [zone]):
        if len(branch.get("enum", ())) > LONG_ENUM:
            kept = sample(branch["enum"])
            names = branch.get("x-enum-varnames")
            if names is not None:
                branch["x-enum-varnames"] = [n for v, n in zip(branch["enum"], names, strict=True) if v in kept]
            branch["enum"] = kept
