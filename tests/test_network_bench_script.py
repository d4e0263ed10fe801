"""benchmarks/network_bench.py: rendering and in-place update of docs/benchmarks.md (no timing)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "network_bench.py"




def _bench(p99_1: float, p50_256: float, speedup: float) -> dict[str, Any]:
    fig = lambda p50, p99: {"p50_us": p50, "p99_us": p99, "calls": 100}  # noqa: E731
    thr = {"ticks_per_s": 1e5, "neuron_updates_per_s": 2e8, "synaptic_events_per_s": 3e8}
    return {
        "fused": {"batch_1": fig(5.0, p99_1), "batch_16": fig(3.0, 4.0), "batch_256": fig(p50_256, p50_256 + 1)},
        "reference": {"batch_1": fig(5.0 * speedup, 6.0 * speedup)},
        "speedup_vs_reference": speedup,
        "network": {"mossy": 48, "granule": 512, "purkinje": 32, "dcn": 12, "steps_per_tick": 4, "precision": "float32",
                    "spikes_per_tick": 100.0},
        "throughput_batch_1": thr, "throughput_batch_256": thr,
        "host": {"machine": "x86_64", "processor": "Test CPU", "cpus": 2, "python": "3.11"},
    }


CROSSVAL = {"ticks": 1000, "markets": 4, "tolerance": 1e-4, "precision": "float64", "passed": True, "first_divergence": None,
            "max_abs_diff": {"granule": 1e-16, "purkinje": 0.0, "dcn": 2e-16, "outputs": 3e-16},
            "spike_flips": {"granule": 0, "purkinje": 0, "dcn": 0}}


def test_block_states_each_target_with_its_verdict(script: ModuleType) -> None:
    good = script.render_block(_bench(8.0, 1.5, 120.0), CROSSVAL, 1, "cerebellar-norse bench --json", None)
    assert good.count("**met**") == 3 and "not met" not in good
    assert "Test CPU, 2 logical CPUs" in good and "**pass**" in good
    bad = script.render_block(_bench(12.0, 4.0, 15.0), CROSSVAL, 1, "cerebellar-norse bench --json", None)
    assert bad.count("**not met**") == 3


def test_update_keeps_other_runs_and_sections(script: ModuleType) -> None:
    doc = "# Benchmarks\n\nintro\n\n## HTTP\n\nhttp figures\n"
    one = script.update_document(doc, 1, "### run one\n")
    two = script.update_document(one, 2, "### run two\n")
    again = script.update_document(two, 1, "### run one, again\n")
    assert "## HTTP\n\nhttp figures" in again and again.startswith("# Benchmarks\n\nintro")
    assert "run one, again" in again and "### run one\n" not in again and "### run two" in again
    assert again.index("run one, again") < again.index("run two")
    assert again.count("## Network kernel") == 1
    assert script.update_document("", 2, "### only\n").startswith("# Benchmarks")


def test_update_keeps_notes_written_after_the_blocks(script: ModuleType) -> None:
    doc = script.update_document("# Benchmarks\n\n## Network kernel\n\n## HTTP\n\nhttp figures\n", 1, "### run one\n")
    end = "<!-- network-kernel:cpu_threads=1:end -->"
    doc = doc.replace(end, f"{end}\n\nNotes on the spread of these runs.")
    again = script.update_document(script.update_document(doc, 2, "### run two\n"), 1, "### run one, again\n")
    assert again.count("Notes on the spread of these runs.") == 1
    assert again.index("run two") < again.index("Notes on the spread") < again.index("## HTTP")
