"""Pictures and weight analysis for debugging: ``analyze-weights`` and a market's spike raster.

Weight analysis (``cerebellar-norse analyze-weights``)
    Per layer of a model's weights (``mg_w``, ``pf_w``, ``pc_bias``, ``w_md``, ``w_pd``,
    ``dcn_bias``, ``w_out``, ``head_gain``, ``head_bias``): count, mean, std, min, max,
    a histogram, and *saturation*: how many weights sit exactly at the layer's minimum or
    maximum (within 1e-6 of its range). One weight is always at each end, so an end counts
    as saturated only when more than one weight shares it — a pile-up that clipping (the
    climbing-fibre rule keeps ``pf_w`` in ``[0, w_max]``) or a collapsed layer leaves; a
    constant layer (the initial biases) is reported as ``constant`` and never saturated.
    ``--threshold T`` adds the fraction of weights with ``|w| > T``.

    *Dead units* (a weight is "~0" when ``|w| <= 1e-6 * max |w|`` of its layer):

    * ``purkinje_no_input``: Purkinje cells whose parallel-fibre weights are all ~0 (only
      their tonic bias drives them; learning cannot reach them);
    * ``purkinje_no_output``: Purkinje cells whose Purkinje→DCN weights are all ~0;
    * ``granule_no_input``: granule cells whose mossy-fibre dendrite weights are all ~0;
    * ``granule_no_output``: granule cells that reach no Purkinje cell through a weight
      that is not ~0 (including those with no parallel-fibre synapse at all);
    * ``dcn_never_excited``: DCN cells whose mossy→DCN weights are all ~0 and whose tonic
      bias is ``<= 0`` (their Purkinje input only inhibits, so nothing excites them);
    * ``dcn_unread``: DCN cells whose readout weights are all ~0;
    * ``class_dead``: readout classes whose readout weights are all ~0 or whose head gain is ~0.

    *Drift* against another model: per layer ``||a - b|| / ||b||`` (relative L2 change,
    ``b`` the model compared with; null when the shapes differ or ``||b|| = 0 != ||a||``),
    and whether the topology (``mg_idx``, ``pf_pre``) differs.

    Input: a stored model (``--model``; default the model the service would serve), a
    model directory or ``.npz`` file, or ``-`` for stdin holding the output of
    ``--dump-weights --format npz`` (the arrays: everything above) or of ``--dump-weights``
    in text or ``--format json`` (statistics only: those carry no arrays, so the summary
    repeats the per-layer statistics and there are no histograms, saturation, dead units
    or drift).
"""

from __future__ import annotations

import io
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError
from ..neurons.topology import HEAD_LAYERS
from ..neurons.topology import LAYERS as WEIGHT_LAYERS
from ..storage import write_output

if TYPE_CHECKING:
    from ..config import Config
    from ..engine.engine import Engine
    from ..engine.records import BatchRecord
    from ..neurons.topology import Weights

LAYERS = {**WEIGHT_LAYERS, **HEAD_LAYERS}
ZERO_REL = 1e-6  # a weight is ~0 when |w| <= ZERO_REL * max |w| of its layer
EDGE_REL = 1e-6  # a weight is at an end of its layer when within EDGE_REL * (max - min) of it
BINS = 50
SHOWN_INDICES = 20
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# -- analysis ---------------------------------------------------------------------------------------


def layer_arrays(w: Weights) -> dict[str, np.ndarray]:
    """The analysed arrays of a weights object, by layer name, as float64."""
    return {name: np.asarray(getattr(w, attr), dtype=np.float64) for name, attr in LAYERS.items()}


def _near_zero(a: np.ndarray) -> np.ndarray:
    scale = float(np.max(np.abs(a))) if a.size else 0.0
    return np.abs(a) <= ZERO_REL * scale


def layer_summary(a: np.ndarray, threshold: float | None = None) -> dict[str, Any]:
    """Statistics, saturation and histogram of one layer."""
    n = int(a.size)
    if n == 0:
        return {"count": 0}
    lo, hi = float(a.min()), float(a.max())
    span = hi - lo
    constant = span == 0.0
    at_min = int(np.count_nonzero(a <= lo + EDGE_REL * span))
    at_max = int(np.count_nonzero(a >= hi - EDGE_REL * span))
    pinned = 0 if constant else (at_min if at_min > 1 else 0) + (at_max if at_max > 1 else 0)
    counts, edges = np.histogram(a, bins=BINS if not constant else 1)
    out: dict[str, Any] = {
        "count": n, "mean": float(a.mean()), "std": float(a.std()), "min": lo, "max": hi,
        "zero_fraction": float(np.mean(_near_zero(a))),
        "saturation": {"constant": constant, "at_min": at_min, "at_max": at_max, "fraction": pinned / n},
        "histogram": {"counts": counts.tolist(), "edges": edges.tolist()},
    }
    if threshold is not None:
        out["saturation"]["beyond_threshold"] = float(np.mean(np.abs(a) > threshold))
        out["saturation"]["threshold"] = threshold
    return out


def _rows_dead(m: np.ndarray) -> np.ndarray:
    """Indices of the rows of ``m`` whose entries are all ~0 (relative to the whole layer)."""
    if m.size == 0:
        return np.arange(m.shape[0])
    return np.nonzero(_near_zero(m).all(axis=1))[0]


def dead_units(w: Weights) -> dict[str, dict[str, Any]]:
    """Units no signal reaches or leaves, by kind: ``{"count", "indices" (first 20)}`` (see module doc)."""
    pf = np.asarray(w.pf_w, dtype=np.float64)
    pd = np.asarray(w.w_pd, dtype=np.float64)
    mg = np.asarray(w.mg_w, dtype=np.float64)
    md = np.asarray(w.w_md, dtype=np.float64)
    out_w = np.asarray(w.w_out, dtype=np.float64)
    n_granule = mg.shape[0]
    live_syn = ~_near_zero(pf)
    reaches = np.zeros(n_granule, dtype=bool)
    reaches[np.asarray(w.pf_pre).reshape(-1)[live_syn.reshape(-1)]] = True
    dcn_bias = np.asarray(w.dcn_bias, dtype=np.float64)
    kinds = {
        "purkinje_no_input": _rows_dead(pf),
        "purkinje_no_output": _rows_dead(pd.T),
        "granule_no_input": _rows_dead(mg),
        "granule_no_output": np.nonzero(~reaches)[0],
        "dcn_never_excited": np.intersect1d(_rows_dead(md), np.nonzero(dcn_bias <= 0)[0]),
        "dcn_unread": _rows_dead(out_w.T),
        "class_dead": np.union1d(_rows_dead(out_w), np.nonzero(_near_zero(np.asarray(w.head_gain, dtype=np.float64)))[0]),
    }
    return {k: {"count": int(v.size), "indices": v[:SHOWN_INDICES].astype(int).tolist()} for k, v in kinds.items()}


def drift(a: Weights, b: Weights) -> dict[str, Any]:
    """Relative L2 change per layer of ``a`` against ``b`` (``||a - b|| / ||b||``), and whether the topology differs."""
    xa, xb = layer_arrays(a), layer_arrays(b)
    layers: dict[str, float | None] = {}
    for name in LAYERS:
        p, q = xa[name], xb[name]
        if p.shape != q.shape:
            layers[name] = None
            continue
        d, ref = float(np.linalg.norm(p - q)), float(np.linalg.norm(q))
        layers[name] = 0.0 if d == 0.0 else (d / ref if ref > 0 else None)
    topo = not (np.array_equal(a.mg_idx, b.mg_idx) and np.array_equal(a.pf_pre, b.pf_pre))
    return {"layers": layers, "topology_changed": topo}


def analyze(w: Weights, version: str, other: tuple[Weights, str] | None = None,
            threshold: float | None = None) -> dict[str, Any]:
    """The full analysis of one model (and its drift against ``other``) as a JSON-able dict."""
    report: dict[str, Any] = {
        "model_version": version,
        "source": "arrays",
        "layers": {name: layer_summary(a, threshold) for name, a in layer_arrays(w).items()},
        "dead_units": dead_units(w),
    }
    if other is not None:
        report["drift"] = {"against": other[1], **drift(w, other[0])}
    return report


# -- inputs -------------------------------------------------------------------------------------------


def _parse_text_dump(text: str, where: str = "stdin") -> dict[str, Any]:
    """The statistics of ``--dump-weights`` text output (``model V``, a header, one row per layer)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) < 2 or not lines[0].startswith("model ") or not lines[1].split()[:2] == ["layer", "count"]:
        raise InputError(f"{where}: not the output of --dump-weights (text, --format json or --format npz)")
    layers = {}
    for ln in lines[2:]:
        parts = ln.split()
        try:
            count, mean, std, lo, hi = int(parts[1]), *map(float, parts[2:6])
        except (ValueError, IndexError):
            raise InputError(f"{where}: unreadable --dump-weights line: {ln!r}") from None
        layers[parts[0]] = {"count": count, "mean": mean, "std": std, "min": lo, "max": hi}
    return {"model_version": lines[0][len("model "):].strip(), "layers": layers}


def read_dump(data: bytes, where: str = "stdin") -> tuple[Weights | None, dict[str, Any] | None, str]:
    """Weights (npz) or statistics (``--dump-weights`` text or JSON) from bytes: ``(weights, stats, version)``."""
    from ..training.checkpoints import weights_from_bytes

    if data[:2] == b"PK":
        return weights_from_bytes(data, where), None, where
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{where}: not the output of --dump-weights (text, --format json or --format npz)") from None
    if text.lstrip().startswith("{"):
        try:
            stats = json.loads(text)
            if not isinstance(stats.get("layers"), dict):
                raise ValueError("no 'layers' object")
        except (ValueError, AttributeError) as exc:
            raise InputError(f"{where}: not the JSON of --dump-weights --format json ({exc})") from None
    else:
        stats = _parse_text_dump(text, where)
    return None, stats, str(stats.get("model_version") or where)


def load_weights(cfg: Config, ref: str | None) -> tuple[Weights, str]:
    """A model's weights: a stored version, a model directory, an ``.npz`` file, or (None) the served model."""
    from ..training.checkpoints import ModelStore, load_model_dir, weights_from_bytes

    if ref is None:
        from ..training.commands import served_weights_named

        return served_weights_named(cfg, "analyze-weights")
    p = Path(ref)
    if p.is_dir():
        m = load_model_dir(p)
        return m.weights, m.version
    if p.is_file():
        try:
            data = p.read_bytes()
        except OSError as exc:
            raise InputError(f"{ref}: cannot read: {exc.strerror}") from None
        return weights_from_bytes(data, ref), p.name
    m = ModelStore(Path(cfg.paths.state_dir)).load(ref)
    return m.weights, m.version


# -- output -------------------------------------------------------------------------------------------


def literal(text: str) -> str:
    """``text`` as matplotlib draws it literally: a ``$`` would start math text (a market id "$$" failed the plot)."""
    return text.replace("$", r"\$")


def histogram_png(w: Weights, version: str, other: tuple[Weights, str] | None = None) -> bytes:
    """A PNG of one histogram per layer (with the compared model's outline when given)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    arrays = {k: a.ravel() for k, a in layer_arrays(w).items()}
    others = {k: a.ravel() for k, a in layer_arrays(other[0]).items()} if other is not None else {}
    cols = 3
    rows = math.ceil(len(arrays) / cols)
    fig = Figure(figsize=(4.2 * cols, 3.0 * rows), dpi=80, layout="constrained")
    fig.suptitle(literal(f"weights of model {version}" + (f" (outline: {other[1]})" if other is not None else "")))
    for k, (name, a) in enumerate(arrays.items()):
        ax = fig.add_subplot(rows, cols, k + 1)
        ax.set_title(f"{name} ({LAYERS[name]}, n={a.size})", fontsize=9)
        if a.size:
            b = others.get(name)
            lo, hi = float(a.min()), float(a.max())
            if b is not None and b.size:
                lo, hi = min(lo, float(b.min())), max(hi, float(b.max()))
            rng = (lo - 0.5, hi + 0.5) if lo == hi else (lo, hi)
            ax.hist(a, bins=BINS, range=rng, color="tab:blue", alpha=0.8, label=literal(version))
            if b is not None and b.size:
                ax.hist(b, bins=BINS, range=rng, histtype="step", color="tab:orange", label=literal(other[1]) if other else "")
            ax.set_yscale("log" if a.size > 100 else "linear")
        ax.tick_params(labelsize=7)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def format_report(report: dict[str, Any]) -> str:
    """The analysis as text: a table of layers, the dead units and the drift."""
    lines = [f"model {report['model_version']}"]
    arrays = report.get("source") == "arrays"
    head = f"{'layer':<26}{'count':>9}{'mean':>12}{'std':>12}{'min':>12}{'max':>12}"
    lines.append(head + (f"{'zero':>8}{'at min':>9}{'at max':>9}{'saturated':>11}" if arrays else ""))
    for name, s in report["layers"].items():
        if not s.get("count"):
            lines.append(f"{name:<26}{0:>9}")
            continue
        row = f"{name:<26}{s['count']:>9}{s['mean']:>12.5g}{s['std']:>12.5g}{s['min']:>12.5g}{s['max']:>12.5g}"
        if arrays:
            sat = s["saturation"]
            row += f"{s['zero_fraction']:>8.3f}{sat['at_min']:>9}{sat['at_max']:>9}"
            row += f"{'constant':>11}" if sat["constant"] else f"{sat['fraction']:>11.4f}"
            if "beyond_threshold" in sat:
                row += f"  |w|>{sat['threshold']:g}: {sat['beyond_threshold']:.4f}"
        lines.append(row)
    if not arrays:
        lines.append("statistics only: the input carries no arrays (no histograms, saturation, dead units or drift); "
                     "pipe --dump-weights --format npz for those")
        return "\n".join(lines) + "\n"
    lines.append("dead units:")
    for kind, d in report["dead_units"].items():
        more = "" if d["count"] <= len(d["indices"]) else ", …"
        shown = f" ({', '.join(map(str, d['indices']))}{more})" if d["count"] else ""
        lines.append(f"  {kind:<22}{d['count']:>7}{shown}")
    if "drift" in report:
        dr = report["drift"]
        lines.append(f"drift against {dr['against']} (relative L2 change ||a-b||/||b||)"
                     + (": topology differs" if dr["topology_changed"] else ""))
        for name, v in dr["layers"].items():
            lines.append(f"  {name:<26}{'n/a' if v is None else format(v, '.6g'):>12}")
    return "\n".join(lines) + "\n"


def cmd_analyze_weights(cfg: Config, source: str | None, model: str | None, compare: str | None, output: str | None,
                        as_json: bool, threshold: float | None) -> int:
    """``cerebellar-norse analyze-weights``: per-layer statistics, saturation, dead units, drift; optional PNG."""
    if source is not None and model is not None:
        raise InputError("give either an input (a file, or - for stdin) or --model, not both", "--model")
    if threshold is not None and not (threshold >= 0 and math.isfinite(threshold)):
        raise InputError(f"--threshold {threshold} must be a finite number >= 0", "--threshold")
    weights: Weights | None
    if source == "-":
        weights, stats, version = read_dump(sys.stdin.buffer.read())
    elif source is not None and Path(source).is_file():
        weights, stats, version = read_dump(Path(source).read_bytes(), source)
    else:
        weights, version = load_weights(cfg, source if source is not None else model)
        stats = None
    if weights is None:
        assert stats is not None
        if compare is not None or output is not None:
            raise InputError("the input holds statistics only: --compare and --output need the arrays "
                             "(pipe --dump-weights --format npz)", "--compare" if compare else "--output")
        report: dict[str, Any] = {"model_version": version, "source": "statistics", "layers": stats["layers"]}
    else:
        other = load_weights(cfg, compare) if compare is not None else None
        report = analyze(weights, version, other, threshold)
        if output is not None:
            write_output(Path(output), histogram_png(weights, version, other))
    if as_json:
        print(json.dumps(report))
    else:
        sys.stdout.write(format_report(report))
        if output is not None:
            print(f"histograms written to {output}")
    return 0


# -- market raster ------------------------------------------------------------------------------------
#
# The engine keeps no history of spikes or potentials. A :class:`MarketTrace`, attached to
# the engine's record sinks on the first raster request, records from then on, for the
# markets asked about (at most WATCHED_MAX, the longest unasked dropped first), per tick:
# the time, the spike count of each population (granule, Purkinje, DCN) and, after the
# batch, the mean membrane potential of each population and the readout potentials. A
# market with several ticks in one batch gets the potentials once, at its last tick of the
# batch (NaN at the others). On CUDA the watched markets' state is copied to the host after
# each batch that holds one of their ticks (a device synchronisation per such batch).

TRACE_KEY = "market_trace"
RING_TICKS = 2000
PICTURES_KEPT = 8  # rasters kept drawn (about 100 KB each)
WATCHED_MAX = 64
TRACED = (("granule", "v_gr"), ("purkinje", "v_pc"), ("dcn", "v_dcn"))


class MarketTrace:
    """Per-tick spike counts and potentials of the watched markets, in bounded rings."""

    def __init__(self, engine: Engine, ring: int = RING_TICKS) -> None:
        from collections import OrderedDict, deque

        self.engine = engine
        self.ring = ring
        self.since: dict[str, float] = {}
        self.rings: OrderedDict[str, deque[tuple[float, tuple[int, ...], tuple[float, ...], tuple[float, ...]]]] = \
            OrderedDict()
        self._deque = deque
        self.pictures: OrderedDict[bytes, bytes] = OrderedDict()  # the last PNGs drawn, by what they show

    def picture(self, key: bytes) -> bytes | None:
        """The PNG drawn last for ``key`` (:func:`series_key`), or None."""
        png = self.pictures.get(key)
        if png is not None:
            self.pictures.move_to_end(key)
        return png

    def keep_picture(self, key: bytes, png: bytes) -> None:
        """Keep a drawn PNG: the same ticks asked for again (a HEAD then its GET, a page reloaded) are not drawn again."""
        self.pictures[key] = png
        while len(self.pictures) > PICTURES_KEPT:
            self.pictures.popitem(last=False)

    @classmethod
    def attach(cls, engine: Engine, registry: dict[str, Any]) -> MarketTrace:
        """The trace kept in ``registry`` (the service's extras), attached to ``engine`` on first use."""
        from .debugtools import attach_once

        return attach_once(cls, engine, registry, TRACE_KEY)

    def watch(self, market_id: str) -> None:
        """Record this market's ticks from now on (a no-op when already watched)."""
        import time

        if market_id in self.rings:
            self.rings.move_to_end(market_id)
            return
        self.rings[market_id] = self._deque(maxlen=self.ring)
        self.since[market_id] = time.time()
        while len(self.rings) > WATCHED_MAX:
            old, _ = self.rings.popitem(last=False)
            self.since.pop(old, None)

    def observe(self, rec: BatchRecord) -> None:
        """Append the watched markets' ticks of one batch (engine sink)."""
        b, spikes = rec.size, rec.spikes
        if b == 0 or not self.rings:
            return
        table = self.engine.pool.table
        watched = {}
        for mid in self.rings:
            slot = table.get(mid)
            if slot is not None:
                watched[int(slot)] = mid
        if not watched:
            return
        slots = np.asarray(rec.slots).tolist()
        last = {s: j for j, s in enumerate(slots) if s in watched}
        if not last:
            return
        arrays = self.engine.pool.arrays
        self.engine.backend.sync_to_host(list(last))  # CUDA: bring the watched slots' state to the host
        nan_v = (math.nan,) * len(TRACED)
        for j, s in enumerate(slots):
            market = watched.get(s)
            if market is None:
                continue
            if last[s] == j:
                v = tuple(float(np.mean(getattr(arrays, attr)[s])) for _, attr in TRACED)
                out = tuple(float(x) for x in np.asarray(arrays.v_out[s]).ravel())
            else:
                v, out = nan_v, ()
            self.rings[market].append((float(rec.ticks[2, j]), tuple(int(x) for x in spikes[j]), v, out))

    def series(self, market_id: str, ticks: int) -> dict[str, Any]:
        """The market's last ``ticks`` recorded ticks as arrays (copies: safe to plot off the loop)."""
        rows = list(self.rings.get(market_id, ()))[-ticks:]
        k = max((len(r[3]) for r in rows), default=0)
        readout = np.full((len(rows), k), np.nan)
        for i, r in enumerate(rows):
            if r[3]:
                readout[i, :len(r[3])] = r[3]
        return {
            "market_id": market_id,
            "since": self.since.get(market_id),
            "time_ms": np.array([r[0] for r in rows]),
            "spikes": np.array([r[1] for r in rows], dtype=np.int64).reshape(len(rows), 3),
            "v": np.array([r[2] for r in rows], dtype=np.float64).reshape(len(rows), len(TRACED)),
            "readout": readout,
        }


def series_key(series: dict[str, Any]) -> bytes:
    """A digest of everything :func:`raster_png` draws of ``series``: equal keys, equal pictures."""
    import hashlib

    h = hashlib.blake2b(repr((series["market_id"], series.get("since"))).encode(), digest_size=16)
    for name in ("time_ms", "spikes", "v", "readout"):
        a = np.ascontiguousarray(series[name])
        h.update(f"{name}{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.digest()


def raster_png(series: dict[str, Any]) -> bytes:
    """A PNG of one market's recorded ticks: population spike raster, spike counts, membrane and readout traces."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from .debugtools import utc_iso

    spikes, v, readout = series["spikes"], series["v"], series["readout"]
    n = len(spikes)
    since = series.get("since")
    fig = Figure(figsize=(9.0, 8.0), dpi=80, layout="constrained")
    fig.suptitle(literal(f"market {series['market_id']}: last {n} tick(s) recorded"
                         + (f" since {utc_iso(since)}" if since else "")), fontsize=10)
    axes = fig.subplots(4, 1, sharex=True)
    x = np.arange(n)
    names = [p for p, _ in TRACED]
    if n == 0:
        for ax in axes:
            ax.text(0.5, 0.5, "no ticks since the first raster request for this market", ha="center", va="center",
                    transform=ax.transAxes)
    else:
        scale = np.maximum(spikes.max(axis=0, keepdims=True), 1)
        axes[0].imshow((spikes / scale).T, aspect="auto", interpolation="nearest", cmap="Greys",
                       extent=(-0.5, n - 0.5, 2.5, -0.5))
        axes[0].set_yticks(range(3), names)
        axes[0].set_title("spike raster (spikes per tick, scaled per population)", fontsize=9)
        for k, name in enumerate(names):
            axes[1].plot(x, spikes[:, k], lw=1, label=name)
            axes[2].plot(x, v[:, k], ".-", lw=1, ms=2, label=name)
        axes[1].set_yscale("symlog")
        axes[1].set_title("spikes per tick", fontsize=9)
        axes[2].set_title("mean membrane potential after the tick", fontsize=9)
        for k in range(readout.shape[1]):
            axes[3].plot(x, readout[:, k], ".-", lw=1, ms=2, label=("down", "flat", "up")[k] if k < 3 else str(k))
        axes[3].set_title("readout potentials", fontsize=9)
        axes[3].set_xlabel("tick (oldest first)")
        for ax in axes[1:]:
            if ax.lines:
                ax.legend(fontsize=7, loc="upper right")
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def raster_path(market_id: str, ticks: int) -> str:
    """The URL path of a market's raster (the id percent-encoded)."""
    from ..httpcalls import path_id

    return f"/debug/markets/{path_id(market_id)}/raster.png?ticks={ticks}"


def cmd_plot_market(cfg: Config, market: str, url: str | None, token: str | None, output: str, ticks: int) -> int:
    """``cerebellar-norse plot-market``: fetch a market's raster PNG from the running service and write it."""
    import httpx

    from ..httpcalls import bearer, call_failure, request_errors, service_error_message
    from .debugtools import config_token, service_url

    url = url or service_url(cfg)
    headers = bearer(token if token is not None else config_token(cfg))
    target = url.rstrip("/") + raster_path(market, ticks)
    try:
        r = httpx.get(target, headers=headers, timeout=30.0)
    except request_errors() as exc:
        print(f"cerebellar-norse: {call_failure(url, exc)}", file=sys.stderr)
        return 1
    if r.status_code != 200 or r.content[:8] != PNG_MAGIC:
        if r.status_code == 401:
            why = "401 unauthorized: pass the service's token (--token, or server.api_token in --config)"
        else:
            why = f"{r.status_code}: {service_error_message(r) or 'not a PNG'}"
        print(f"cerebellar-norse: {url.rstrip('/')}{raster_path(market, ticks).split('?')[0]}: {why}", file=sys.stderr)
        return 1
    write_output(Path(output), r.content)
    print(f"raster of {market} written to {output}")
    return 0
