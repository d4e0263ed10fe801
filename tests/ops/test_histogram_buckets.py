"""The latency histograms' bucket edges keep ``histogram_quantile`` within 20 % of the exact quantile.

Observations from several distributions go through the service's own histogram
(:class:`TickHistogram`, the exposition's ``le`` labels); the quantile Prometheus would
report is computed twice: by :func:`histogram_quantile` below (Prometheus' documented
interpolation) and by the real PromQL engine (``promtool test rules``, where installed),
which must agree with each other and be within 20 % of the exact quantile.
"""

from __future__ import annotations

import itertools
import math
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import yaml  # type: ignore[import-untyped]

from cerebellar_norse.observability.metrics import LADDER, PROCESSING_BUCKETS, REQUEST_BUCKETS, TickHistogram

PROMTOOL = shutil.which("promtool")
QUANTILES = (0.5, 0.95, 0.99)
RATIO = 1.2
TOLERANCE = RATIO - 1  # the bound of metrics' module docstring: over-estimate ≤ r − 1, under-estimate ≤ 1 − 1/r
N = 20_000


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """Prometheus' ``histogram_quantile`` of one classic histogram (seconds).

    ``buckets``: (upper bound, cumulative count), ascending, the last one +Inf. As
    documented: the rank q·N falls in the first bucket whose cumulative count reaches
    it; the result is interpolated linearly between that bucket's lower bound (the
    previous upper bound, 0 for the first bucket) and its upper bound; a rank in the
    +Inf bucket gives the highest finite upper bound.
    """
    assert math.isinf(buckets[-1][0]) and len(buckets) >= 2
    rank = q * buckets[-1][1]
    b = next((i for i, (_, c) in enumerate(buckets[:-1]) if c >= rank), len(buckets) - 1)
    if b == len(buckets) - 1:
        return buckets[-2][0]
    if b == 0 and buckets[0][0] <= 0:
        return buckets[0][0]
    start, below = (0.0, 0.0) if b == 0 else buckets[b - 1]
    end, count = buckets[b][0], buckets[b][1] - below
    return start + (end - start) * (rank - below) / count


def exposed(values: np.ndarray, bounds: Sequence[float]) -> list[tuple[str, float]]:
    """(le label, cumulative count) of ``values`` (s) observed through the service's histogram."""
    h = TickHistogram(bounds)
    for v in values:
        h.observe_many(float(v), 1)
    return [(s.labels["le"], s.value) for s in h.family("h", "test histogram").samples if s.name == "h_bucket"]


def exact(values: np.ndarray, q: float) -> float:
    """The smallest observation with at least q·N observations ≤ it (what the bucket of the rank holds)."""
    return float(np.quantile(values, q, method="inverted_cdf"))


def lognormal(median_s: float, sigma: float, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).lognormal(math.log(median_s), sigma, N)


# (name, bounds, observations in s): lognormals centred at 5, 30, 150 µs (processing) and
# 50 µs, 400 µs, 3 ms (requests), a two-mode mix, and the worst case of the bound (all
# observations just above one edge, so the rank's bucket holds nothing near its top)
CASES = [
    ("proc_ln5us", PROCESSING_BUCKETS, lognormal(5e-6, 0.3, 1)),
    ("proc_ln30us", PROCESSING_BUCKETS, lognormal(30e-6, 0.5, 2)),
    ("proc_ln150us", PROCESSING_BUCKETS, lognormal(150e-6, 0.4, 3)),
    ("proc_mix8us_80us", PROCESSING_BUCKETS, np.concatenate([lognormal(8e-6, 0.2, 4)[: N * 9 // 10],
                                                             lognormal(80e-6, 0.3, 5)[: N // 10]])),
    ("proc_worst_case", PROCESSING_BUCKETS, np.full(N, 1.42e-5 * (1 + 1e-9))),
    ("req_ln50us", REQUEST_BUCKETS, lognormal(50e-6, 0.4, 6)),
    ("req_ln400us", REQUEST_BUCKETS, lognormal(400e-6, 0.5, 7)),
    ("req_ln3ms", REQUEST_BUCKETS, lognormal(3e-3, 0.3, 8)),
]


def test_ladders_step_by_at_most_1_2_over_their_ranges() -> None:
    assert len(LADDER) == 13 and RATIO ** (len(LADDER) - 1) < 10  # 12 steps of 1.2 cannot span a decade
    for bounds, lo, hi in ((PROCESSING_BUCKETS, 1e-6, 1e-3), (REQUEST_BUCKETS, 20e-6, 1e-2)):
        assert list(bounds) == sorted(set(bounds))
        inner = [b for b in bounds if b <= hi]
        assert inner[0] <= lo and inner[-1] == hi
        assert max(b / a for a, b in itertools.pairwise(inner)) <= RATIO * (1 + 1e-12)
        assert len(bounds) <= 45
    assert 1e-5 in PROCESSING_BUCKETS and PROCESSING_BUCKETS[-1] == 1e-2  # the alert threshold; coverage to 10 ms
    assert REQUEST_BUCKETS[-1] == 1.0


@pytest.mark.parametrize(("name", "bounds", "values"), CASES, ids=[c[0] for c in CASES])
def test_histogram_quantile_is_within_20_percent_of_the_exact_quantile(name: str, bounds: Sequence[float],
                                                                       values: np.ndarray) -> None:
    buckets = [(float(le), c) for le, c in exposed(values, bounds)]
    for q in QUANTILES:
        x = exact(values, q)
        est = histogram_quantile(q, buckets)
        assert abs(est / x - 1) <= TOLERANCE, (name, q, est, x)
    if name == "proc_worst_case":  # the bound is nearly reached: p99 of a bucket filled at its bottom
        assert histogram_quantile(0.99, buckets) / exact(values, 0.99) - 1 > 0.18


def test_the_old_edges_overstated_by_up_to_2x() -> None:
    """What the ladder fixes: with no edge between 100 and 250 µs, a p95 of ~110 µs read as ~240 µs."""
    old = (1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2)
    values = lognormal(105e-6, 0.02, 9)
    est = histogram_quantile(0.95, [(float(le), c) for le, c in exposed(values, old)])
    assert est / exact(values, 0.95) > 1.8


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (make tools installs it)")
def test_promql_histogram_quantile_agrees_and_is_within_20_percent(tmp_path: Path) -> None:
    """The real PromQL engine: its histogram_quantile over rate() equals the formula above and is within 20 %."""
    series, tests = [], []
    for name, bounds, values in CASES:
        cum = exposed(values, bounds)
        series += [{"series": f'h_bucket{{dist="{name}",le="{le}"}}', "values": f"0+{int(c)}x10"} for le, c in cum]
        for q in QUANTILES:
            # nanoseconds, so that the series notation holds plain decimals
            formula = histogram_quantile(q, [(float(le), c) for le, c in cum])
            series.append({"series": f'formula_ns{{dist="{name}",q="{q}"}}', "values": f"{formula * 1e9:.6f}x10"})
            series.append({"series": f'exact_ns{{dist="{name}",q="{q}"}}', "values": f"{exact(values, q) * 1e9:.6f}x10"})
    for q in QUANTILES:
        hq = f"histogram_quantile({q}, rate(h_bucket[5m]))"
        for other, tol in (("formula_ns", 1e-6), ("exact_ns", TOLERANCE)):
            tests.append({"expr": f'abs({hq} * 1e9 / on(dist) {other}{{q="{q}"}} - 1) <= bool {tol}', "eval_time": "10m",
                          "exp_samples": [{"labels": f'{{dist="{name}"}}', "value": 1} for name, _, _ in CASES]})
    spec = {"evaluation_interval": "1m", "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": tests}]}
    path = tmp_path / "quantiles_test.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    r = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]


def test_request_metrics_expose_what_prometheus_client_would() -> None:
    """The request counters kept in plain counters give the exposition prometheus_client's Counter and Histogram give."""
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from cerebellar_norse.observability.metrics import ServiceMetrics

    rng = np.random.default_rng(3)
    reference = CollectorRegistry()
    ref_total = Counter("cerebellar_norse_http_requests_total", "x", ["route", "method", "status"], registry=reference)
    ref_seconds = Histogram("cerebellar_norse_http_request_duration_seconds", "x", ["route"], buckets=REQUEST_BUCKETS,
                            registry=reference)
    ours = ServiceMetrics()
    calls = [("/neural/process", "POST", 200), ("/neural/process", "POST", 422), ("/health", "GET", 200), ("other", "GET", 404)]
    # values on the edges themselves included: an edge's own value belongs to its bucket (le is inclusive)
    values = [*rng.lognormal(math.log(80e-6), 1.2, 3000), *REQUEST_BUCKETS, 0.0, 5.0]
    for k, v in enumerate(values):
        route, method, status = calls[k % len(calls)]
        ours.count_request(route, method, status, float(v))
        ref_total.labels(route, method, str(status)).inc()
        ref_seconds.labels(route).observe(float(v))

    def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text.decode())
                if fam.name.startswith("cerebellar_norse_http_request")
                for s in fam.samples if not s.name.endswith("_created")}

    got, want = samples(ours.render()), samples(generate_latest(reference))
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-12), key
