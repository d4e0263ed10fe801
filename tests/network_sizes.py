"""Network sizes shared by the test suites (``[neural]`` overrides)."""

from __future__ import annotations

from typing import Any

# Between tiny and the default: cheap for the Norse reference and torch on the CPU,
# still spiking in every population.
SMALL_NEURAL: dict[str, Any] = {
    "mossy_size": 24,
    "granule_size": 128,
    "purkinje_size": 8,
    "connections_per_neuron": 32,
    "dcn_size": 6,
}
