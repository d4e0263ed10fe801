"""Reports of an evaluation summary (``evaluation.score``): a terminal table and one HTML file.

``render_html`` writes a single self-contained page: inline CSS, no scripts, no links,
plots as inline base64 PNGs drawn with matplotlib's non-interactive Agg backend
(imported inside the function, so importing this module stays cheap). Every string
taken from the summary (market ids, predictor names, the title) is HTML-escaped.
Metrics are printed with 4 decimals, P&L in bp with 2, counts as integers; undefined
values (None) as "—" ("-" in the terminal table).
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .data import CLASS_NAMES

METRICS = (("accuracy", "accuracy"), ("directional_accuracy", "dir. accuracy"), ("log_loss", "log loss"),
           ("direction_log_loss", "dir. log loss"), ("brier", "Brier"), ("ece", "ECE"), ("direction_ece", "dir. ECE"))
DIFF_METRICS = (("log_loss", "log loss"), ("direction_log_loss", "dir. log loss"), ("accuracy", "accuracy"),
                ("directional_accuracy", "dir. accuracy"))
PNL_FIELDS = (("trades", "trades"), ("hit_rate", "hit rate"), ("mean_trade_bp", "gross/trade bp"),
              ("turnover", "turnover"), ("costs_bp", "costs bp"), ("total_bp", "total bp"),
              ("sharpe_per_trade", "Sharpe/trade"), ("sharpe_annualised", "Sharpe/year"))
PNL_NOTE = ("P&L: at each tick a trade of sign(P(up) − P(down)), size 1/horizon, held for the horizon; one book per "
            "market; hit rate and gross/trade (a size-1 trade's mean return) before costs; costs = cost_bp / 2 × "
            "turnover (Σ|ΔP| of the books, opening and closing included: a round trip of the whole position is 2); "
            "total = gross − costs; Sharpe/trade = mean / sd of the net P&L per tick")
MAX_PLOT_POINTS = 2000
DIRECTION_BASELINES = ("base_rates", "persistence", "mean_reversion", "always_up", "logistic")  # those with a direction

NO_EDGE_NOTE = ("training found no edge on its validation split, so the model serves its base rates: the same "
                "probabilities at every tick, hence one direction traded at every tick; its trade figures are the base "
                "rates' (the base-rates row), not a signal to act on")


NO_DIRECTION_NOTE = ("training found an edge only in whether prices move (edge: flat), not in which way: the model's "
                     "P(up) / P(down) is the same at every tick, so its sign strategy trades one direction at every tick; "
                     "its directional figures and trade figures are those of a constant position (the always_up row, or "
                     "its mirror when it is short), not a signal to act on")


def edge_note(edge: Any) -> str | None:
    """The line above the figures of a model without a directional edge (None for one with)."""
    if edge == "none":
        return f"NO EDGE: {NO_EDGE_NOTE}"
    if edge == "flat":
        return f"NO DIRECTIONAL EDGE: {NO_DIRECTION_NOTE}"
    return None


def verdict(summary: Mapping[str, Any]) -> dict[str, str]:
    """What the figures of ``summary`` (``evaluation.score``'s, with ``edge`` and ``in_sample`` where known) support:
    ``{"action": "trade" | "do_not_trade" | "collect_more_data", "reason": ...}``.

    In order: figures in sample, figures whose being in sample cannot be told (``in_sample_unknown``: a model stored
    by an earlier version without the period or fingerprint of its data), a model without a directional edge (``edge`` none or flat), no intervals, a
    direction log loss worse than a directional baseline (``DIRECTION_BASELINES``) with its 95 % interval above
    0, or one whose interval includes 0 and whose difference is not below 0 are ``do_not_trade``; better than
    every one by the point estimates but with an interval including 0 is ``collect_more_data``; better than every one
    (intervals below 0) but with no cost charged, a P&L after costs at or below 0 or at or below that of a constant
    position (always long or always short, by the point estimate of the model's difference with it) is
    ``do_not_trade``; above those by the point estimates but with the 95 % interval of the P&L, or of a difference
    with a constant position, not above 0 is ``collect_more_data``; and where the scored prices bounce between bid and
    ask (``summary["bounce"]``, :func:`evaluation.bid_ask_bounce`), a cost charged below the spread that bounce implies
    is ``do_not_trade`` before the P&L is read: at the printed prices the bounce pays a direction what a taker pays to
    trade it; else ``trade``.
    """
    in_sample = summary.get("in_sample")
    if isinstance(in_sample, Mapping):
        which = (f"{in_sample['ticks']} of the {in_sample.get('of')} scored ticks" if in_sample.get("ticks")
                 else "some of the scored ticks")
        what = ("repeat the ticks the model (or one it started from) was trained and validated on (under other dates"
                " or names)"
                if in_sample.get("repeats") else
                "are from the period the model (or one it started from) was trained and validated on")
        return {"action": "do_not_trade",
                "reason": f"{which} {what}: in-sample figures cannot tell skill from fitting; decide on unseen ticks only"
                          + (f" (evaluate --since {in_sample['since']})" if in_sample.get("since") else "")}
    if summary.get("in_sample_unknown"):
        return {"action": "do_not_trade",
                "reason": "whether the scored ticks are in sample cannot be told (the model records neither the period "
                          "nor a fingerprint of the data it was trained on): decide on ticks known to be unseen only"}
    edge = summary.get("edge")
    if edge == "none":
        return {"action": "do_not_trade", "reason": "training found no edge: the model serves its base rates"}
    if edge == "flat":
        return {"action": "do_not_trade",
                "reason": "training found no directional edge: the model's direction is the same at every tick"}
    vs = summary.get("vs_baselines") or {}
    cells = {name: (vs.get(name) or {}).get("direction_log_loss") or {} for name in DIRECTION_BASELINES if name in vs}
    moving = summary.get("moving_samples") or 0
    spans = f"{moving} moving labels over about {horizons_text(summary)}"
    if not cells or any(not c.get("ci95") or None in c["ci95"] for c in cells.values()):
        return {"action": "do_not_trade",
                "reason": "no confidence intervals (--bootstrap 0, or no moving labels): the figures cannot tell skill "
                          "from chance; re-run with --bootstrap 1000"}
    worse = [name for name, c in cells.items() if c["ci95"][0] > 0]
    if worse:
        return {"action": "do_not_trade",
                "reason": "direction log loss worse than " + ", ".join(
                    f"{name} ({_ci_text(cells[name], '-')})" for name in worse) + " (95 % intervals above 0)"}
    unclear = [name for name, c in cells.items() if c["ci95"][1] >= 0]
    level = [name for name in unclear if (cells[name].get("diff") or 0.0) >= 0]
    if level:
        return {"action": "do_not_trade",
                "reason": "direction log loss no better than " + ", ".join(
                    f"{name} ({_ci_text(cells[name], '-')})" for name in level)
                          + f" even before its uncertainty, on {spans}: no edge shown"}
    if unclear:
        return {"action": "collect_more_data",
                "reason": "direction log loss not distinguishable from " + ", ".join(
                    f"{name} ({_ci_text(cells[name], '-')})" for name in unclear)
                          + f" (95 % intervals include 0) on {spans}: better by its point estimates, but no edge "
                          "shown yet; do not trade it before more unseen data confirms it"}
    pnl = ((summary.get("model") or {}).get("pnl") or {})
    total = pnl.get("total_bp")
    better = f"direction log loss better than every baseline (95 % intervals below 0, {spans})"
    cost = summary.get("cost_bp") or 0.0
    spread, bounce = _bounce(summary.get("bounce"))
    if not cost:
        return {"action": "do_not_trade",
                "reason": f"{better}, but the P&L charges no cost: score it with evaluate --cost-bp (a round trip's spread and "
                          "fees) before deciding" + (f"; {bounce}: charge at least that" if bounce else "")}
    if spread is not None and cost < spread:
        return {"action": "do_not_trade",
                "reason": f"{better}, but the {cost:g} bp charged per round trip is less than the spread its prices imply: "
                          f"{bounce}; at the printed prices a direction that lives on the bounce earns what a taker pays "
                          f"to trade it: score it with evaluate --cost-bp {math.ceil(spread * 100) / 100:.2f} or more"}
    after = f"after {cost:g} bp per round trip on its turnover"
    if total is None or total <= 0:
        return {"action": "do_not_trade",
                "reason": f"{better}, but it does not pay its costs: total {_fmt(total, 2, '-')} bp {after}"}
    total_ci = pnl.get("total_bp_ci95")
    total_text = f"{total:.2f} bp [{_fmt((total_ci or [None])[0], 2, '-')}, {_fmt((total_ci or [None, None])[1], 2, '-')}]"
    constant = [(name, pnl.get(f"vs_{key}") or {}) for name, key in (("always long", "always_long"),
                                                                       ("always short", "always_short"))]
    # the constant positions: a drift is not an edge, whichever way the market went
    beaten = [(name, cell) for name, cell in constant if cell.get("diff_bp") is None or cell["diff_bp"] <= 0]
    if beaten:
        name, cell = beaten[0]
        return {"action": "do_not_trade",
                "reason": f"{better}, but {after} its P&L ({total:.2f} bp) is no better than {name}'s (model − "
                          f"{name}: {_fmt(cell.get('diff_bp'), 2, '-', signed=True)} bp)"}
    if not total_ci or None in total_ci or total_ci[0] <= 0:
        return {"action": "collect_more_data",
                "reason": f"{better}, and {after} its P&L is positive by its point estimate, but its 95 % interval "
                          f"includes 0 ({total_text}): no profit shown yet; do not trade it before more unseen data "
                          "confirms it"}
    drift = [(name, cell) for name, cell in constant if not cell.get("ci95") or None in cell["ci95"]
             or cell["ci95"][0] <= 0]
    if drift:
        return {"action": "collect_more_data",
                "reason": f"{better}, and {after} its P&L ({total_text}) is positive, but not distinguishable from "
                          + " and ".join(f"{name}'s (model − {name}: {_pnl_ci_text(cell)} bp)" for name, cell in drift)
                          + ": a drift is not an edge; do not trade it before more unseen data confirms it"}
    return {"action": "trade",
            "reason": f"{better}, and {after} its P&L ({total_text}, 95 % interval) is above 0 and above "
                      + " and ".join(f"{name}'s (model − {name}: {_pnl_ci_text(cell)} bp)" for name, cell in constant)
                      + "; the intervals assume the future resembles these ticks: confirm on later unseen data before "
                        "sizing up"}


def horizons_text(summary: Mapping[str, Any]) -> str:
    """``N non-overlapping horizons``: about how many independent outcomes the scored labels are. Labels of ticks less
    than a horizon apart share returns, and so do those of markets of one period at one time (they move together): with
    several markets the count is of horizons of time, the rows of every market in one horizon
    (``bootstrap.horizon_rows``) counted once, as the intervals count them."""
    samples = int(summary.get("samples") or 0)
    horizon = max(int(summary.get("horizon") or 1), 1)
    rows = (summary.get("bootstrap") or {}).get("horizon_rows")
    if isinstance(rows, int) and rows > horizon:
        return f"{samples // rows} non-overlapping horizons of time, every market's ticks in one horizon counted once"
    return f"{samples // horizon} non-overlapping horizons"


def _bounce(bounce: Any) -> tuple[float | None, str | None]:
    """The round-trip spread in bp that the scored prices' bid-ask bounce implies (``evaluation.bid_ask_bounce``) and
    the words saying so; (None, None) where they show none. Where markets were tested on their own and some bounce,
    the words name them (the five of the largest spreads) with their own figures."""
    if not isinstance(bounce, Mapping) or bounce.get("spread_bp") is None:
        return None, None
    spread = float(bounce["spread_bp"])
    roll = "Roll's estimate, 2 √(−autocovariance)"
    own = bounce.get("markets")
    if isinstance(own, Mapping) and own:
        names = list(own)
        shown = "; ".join(f"{name}: {_bounce_figures(own[name])}, about {float(own[name]['spread_bp']):.2f} bp"
                          for name in names[:5])
        more = f"; and {len(names) - 5} more" if len(names) > 5 else ""
        pooled = bounce.get("pooled_spread_bp")
        return spread, (f"the scored prices of {len(names)} of the markets bounce between bid and ask, each tested on "
                        f"its own ({shown}{more}; {roll}): an effective spread of up to about {spread:.2f} bp per "
                        "round trip" + (f" (pooled over every market: {float(pooled):.2f} bp)" if pooled else ""))
    return spread, (f"the scored prices bounce between bid and ask ({_bounce_figures(bounce)}): an effective spread "
                    f"of about {spread:.2f} bp per round trip ({roll})")


def _bounce_figures(bounce: Mapping[str, Any]) -> str:
    """``lag-1 autocorrelation of their returns … over … returns, …% of their moves turned back by the next one``."""
    turned = (f", {float(bounce['reversals']):.0%} of their moves turned back by the next one"
              if bounce.get("reversals") is not None else "")
    return (f"lag-1 autocorrelation of their returns {float(bounce.get('lag1_autocorrelation') or 0.0):+.3f} over "
            f"{bounce.get('returns')} returns{turned}")


def _pnl_ci_text(cell: Mapping[str, Any]) -> str:
    """``+d [lo, hi]`` of a P&L difference in bp (2 decimals)."""
    return _interval_text(cell.get("diff_bp"), cell.get("ci95"), 2, "-", signed=True)


def headline(summary: Mapping[str, Any]) -> list[str]:
    """The lines above the figures, the same in the terminal and the HTML report: in sample (``IN SAMPLE``), a
    model without a directional edge (``NO EDGE``, ``NO DIRECTIONAL EDGE``), what to do (``VERDICT``)."""
    lines = []
    in_sample = summary.get("in_sample")
    if isinstance(in_sample, Mapping) and in_sample.get("message"):
        lines.append(f"IN SAMPLE: {in_sample['message']}")
    if summary.get("in_sample_unknown"):
        lines.append(f"IN SAMPLE UNKNOWN: {summary['in_sample_unknown']}")
    note = edge_note(summary.get("edge"))
    if note:
        lines.append(note)
    v = summary.get("verdict")
    if isinstance(v, Mapping) and v.get("action"):
        lines.append(f"VERDICT: {str(v['action']).replace('_', ' ')}: {v.get('reason', '')}")
    return lines


def _fmt(value: Any, digits: int = 4, none: str = "—", signed: bool = False) -> str:
    if value is None:
        return none
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        if not np.isfinite(value):
            return none
        return f"{float(value):+.{digits}f}" if signed else f"{float(value):.{digits}f}"
    return str(value)


def _pnl_fmt(key: str, value: Any, none: str) -> str:
    if key == "trades":
        return _fmt(value, none=none)
    return _fmt(value, 2 if key.endswith("_bp") or key == "turnover" else 4, none=none)


def _interval_text(value: Any, ci: Any, digits: int, none: str, signed: bool = False) -> str:
    """``value [lo, hi]`` (the interval left out where there is none)."""
    text = _fmt(value, digits, none=none, signed=signed)
    if isinstance(ci, Sequence) and len(ci) == 2 and None not in ci:
        text += f" [{_fmt(ci[0], digits, signed=signed)}, {_fmt(ci[1], digits, signed=signed)}]"
    return text


def pnl_lines(summary: Mapping[str, Any], none: str = "-") -> list[str]:
    """The lines under the P&L table: what the figures are, the model's net P&L and Sharpe ratios with their 95 %
    intervals, its differences with the constant positions, and how the Sharpe ratio was annualised."""
    pnl = (summary.get("model") or {}).get("pnl") or {}
    if not isinstance(pnl, Mapping) or "total_bp" not in pnl:
        return []
    lines = [PNL_NOTE]
    if "total_bp_ci95" in pnl:
        lines.append("model after costs (95% block-bootstrap CI): total "
                     f"{_interval_text(pnl.get('total_bp'), pnl.get('total_bp_ci95'), 2, none)} bp, per tick "
                     f"{_interval_text(pnl.get('net_per_tick_bp'), pnl.get('net_per_tick_bp_ci95'), 4, none)} bp, "
                     f"Sharpe/trade {_interval_text(pnl.get('sharpe_per_trade'), pnl.get('sharpe_per_trade_ci95'), 4, none)}"
                     f", Sharpe/year {_interval_text(pnl.get('sharpe_annualised'), pnl.get('sharpe_annualised_ci95'), 4, none)}")
        lines.append("model − always long: " + _pnl_ci_text(pnl.get("vs_always_long") or {}) + " bp; model − always short: "
                     + _pnl_ci_text(pnl.get("vs_always_short") or {}) + " bp")
    note = (summary.get("annualisation") or {}).get("note")
    if note:
        lines.append(f"Sharpe/year: {note}")
    given = summary.get("bounce")
    if isinstance(given, Mapping) and given.get("mid_prices"):
        lines.append("bid-ask bounce: not read, the prices are mids or index levels (--mid-prices); the P&L fills at "
                     "them, so --cost-bp must charge the spread a trade crosses")
    spread, bounce = _bounce(given)
    if spread is not None:
        cost = float(summary.get("cost_bp") or 0.0)
        lines.append(f"bid-ask bounce: {bounce}; the P&L fills at the printed prices, so "
                     + (f"the {cost:g} bp charged pays less than a taker's round trip" if cost < spread
                        else f"the {cost:g} bp charged covers it"))
    return lines


def interval_quantile_line(summary: Mapping[str, Any]) -> str | None:
    """How wide the intervals were made for the rows' number: the Student t quantile and its degrees of freedom, or
    None (no intervals, or a summary from before they were recorded)."""
    note = summary.get("bootstrap") or {}
    dof, t = note.get("degrees_of_freedom") or {}, note.get("t_quantile") or {}
    if not note.get("resamples") or dof.get("all_rows") is None or t.get("all_rows") is None:
        return None
    line = (f"intervals: blocks of {note.get('block_length')} rows, the point ± Student t × the bootstrap's exact sd "
            f"(all rows: {dof['all_rows']:g} degrees of freedom, t {t['all_rows']:.3f}")
    if dof.get("moving_rows") is not None and t.get("moving_rows") is not None:
        line += f"; moving rows: {dof['moving_rows']:g}, t {t['moving_rows']:.3f}"
    return line + ", against 1.960): fewer blocks, wider intervals"


def _predictors(summary: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    out: list[tuple[str, Mapping[str, Any]]] = []
    if isinstance(summary.get("model"), Mapping):
        out.append(("model", summary["model"]))
    out.extend((str(name), m) for name, m in (summary.get("baselines") or {}).items() if isinstance(m, Mapping))
    return out


def _pnl_rows(summary: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    rows = [(name, m["pnl"]) for name, m in _predictors(summary) if isinstance(m.get("pnl"), Mapping)]
    model = summary.get("model") or {}
    if isinstance(model.get("always_long"), Mapping) and "always_up" not in (summary.get("baselines") or {}):
        rows.insert(1 if rows else 0, ("always_long", model["always_long"]))  # a summary from before that baseline
    if isinstance(model.get("always_short"), Mapping):
        rows.append(("always_short", model["always_short"]))
    return rows


def _ci_text(cell: Mapping[str, Any] | None, none: str) -> str:
    if not cell or cell.get("diff") is None:
        return none
    text = _fmt(cell["diff"], signed=True)
    ci = cell.get("ci95")
    if ci and ci[0] is not None and ci[1] is not None:
        text += f" [{_fmt(ci[0], signed=True)}, {_fmt(ci[1], signed=True)}]"
    return text


def _overview(summary: Mapping[str, Any]) -> str:
    counts = summary.get("class_counts") or {}
    parts = [f"{name} {_fmt(counts.get(name), none='-')}" for name in CLASS_NAMES]
    samples, horizon = summary.get("samples"), summary.get("horizon")
    spans = ""
    if isinstance(samples, int) and isinstance(horizon, int) and horizon > 1:
        # the labels of ticks less than a horizon apart share returns: the independent samples are about these
        spans = f" (about {horizons_text(summary)})"
    return (f"samples {_fmt(samples, none='-')} ({', '.join(parts)}), "
            f"moving {_fmt(summary.get('moving_samples'), none='-')}, horizon {_fmt(horizon, none='-')} "
            f"ticks{spans}, cost {_fmt(summary.get('cost_bp'), 2, none='-')} bp")


def _scope(summary: Mapping[str, Any]) -> str:
    """What was scored (as ``evaluate``'s first line says it): the model, labels, warm-up, --since, base rates'
    source; empty for a summary without them (``train``'s test split)."""
    parts = []
    if summary.get("labels"):
        parts.append(str(summary["labels"]))
    if summary.get("warmup_ticks") is not None:
        parts.append(f"first {summary['warmup_ticks']} ticks of each market excluded")
    if summary.get("since"):
        parts.append(f"from --since {summary['since']} = {summary.get('since_utc')}")
    if summary.get("base_rates_from"):
        parts.append(f"base rates from {summary['base_rates_from']}")
    if not summary.get("model_version"):
        return ""
    return f"model {summary['model_version']} on {summary.get('samples')} ticks ({'; '.join(parts)})"


def _text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths, strict=True)))]
    for row in rows:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))))
    return lines


def format_summary(summary: dict[str, Any]) -> str:
    """A compact plain-text report of ``evaluation.score``'s summary for the terminal."""
    none = "-"
    lines = [_overview(summary), ""]
    preds = _predictors(summary)
    lines += _text_table(["predictor", *[label for _, label in METRICS]],
                         [[name, *[_fmt(m.get(key), none=none) for key, _ in METRICS]] for name, m in preds])
    lines.append("")
    lines += _text_table(["recall", *CLASS_NAMES],
                         [[name, *[_fmt((m.get("recall") or {}).get(c), none=none) for c in CLASS_NAMES]]
                          for name, m in preds])
    lines.append("")
    lines += _text_table(["P&L", *[label for _, label in PNL_FIELDS]],
                         [[name, *[_pnl_fmt(key, p.get(key), none) for key, _ in PNL_FIELDS]]
                          for name, p in _pnl_rows(summary)])
    lines += pnl_lines(summary, none)
    vs = summary.get("vs_baselines") or {}
    if vs:
        lines.append("")
        lines.append("model − baseline (95% block-bootstrap CI; log losses: lower is better)")
        lines += _text_table(["baseline", *[label for _, label in DIFF_METRICS]],
                             [[str(name), *[_ci_text(cells.get(key), none) for key, _ in DIFF_METRICS]]
                              for name, cells in vs.items()])
        quantile = interval_quantile_line(summary)
        if quantile:
            lines.append(quantile)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- HTML

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; }
td { text-align: right; font-variant-numeric: tabular-nums; }
td:first-child, th:first-child { text-align: left; }
th { background: #f2f2f2; }
img { max-width: 100%; margin: 0.5em 1em 1em 0; border: 1px solid #eee; }
.plots { display: flex; flex-wrap: wrap; }
.note { color: #555; font-size: 0.9em; }
.warning { color: #8a1c00; }
"""


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _section(title: str, content: str) -> str:
    return f"<h2>{html.escape(title)}</h2>\n{content}\n"


def _downsample(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = y.shape[0]
    if n <= MAX_PLOT_POINTS:
        return np.arange(n), y
    idx = np.unique(np.linspace(0, n - 1, MAX_PLOT_POINTS).astype(np.int64))
    return idx, y[idx]


def _number(value: Any, otherwise: float = float("nan")) -> float:
    """``value`` as a float when it is a finite number (a bool is not), else ``otherwise``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else otherwise


def render_html(summary: dict[str, Any], cumulative: dict[str, np.ndarray] | None = None,
                learning_curve: list[dict[str, Any]] | None = None,
                title: str = "cerebellar-norse evaluation") -> str:
    """One self-contained HTML page of ``evaluation.score``'s summary.

    Plots (inline PNG): the model's direction reliability diagram (mean predicted
    q = P(up)/(P(up)+P(down)) vs observed up frequency per bin, with the diagonal and the
    bin counts), its confusion matrix with counts, the cumulative P&L in bp of the model vs
    always-long (when ``cumulative`` from ``evaluation.cumulative_pnl`` is given) and the
    learning curve (``learning_curve`` = ``[{"epoch", "train_loss", "validation": {"loss",
    ...}}]``, skipped when None or empty). Tables: every metric of ``summary``.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    def png(draw: Callable[[Any], None], size: tuple[float, float] = (5.0, 4.0)) -> str:
        fig = Figure(figsize=size, dpi=90, layout="constrained")
        ax = fig.add_subplot()
        draw(ax)
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        data = base64.b64encode(buf.getvalue()).decode("ascii")
        return f'<img src="data:image/png;base64,{data}" alt="">'

    model: Mapping[str, Any] = summary.get("model") or {}
    plots: list[str] = []

    reliability = [b for b in model.get("reliability") or [] if b.get("count")]

    def draw_reliability(ax: Any) -> None:
        ax.plot([0, 1], [0, 1], "--", color="grey", lw=1, label="perfect calibration")
        xs = [b["mean_predicted"] for b in reliability]
        ys = [b["observed"] for b in reliability]
        ax.plot(xs, ys, "o-", color="C0", label="model")
        for b in reliability:
            ax.annotate(str(b["count"]), (b["mean_predicted"], b["observed"]), textcoords="offset points",
                        xytext=(4, -10), fontsize=7, color="C0")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("predicted q = P(up) / (P(up) + P(down))")
        ax.set_ylabel("observed up frequency (moving labels)")
        ax.set_title("Direction reliability (labels: bin counts)")
        ax.legend(loc="upper left", fontsize=8)

    plots.append(png(draw_reliability))

    confusion = np.asarray(model.get("confusion") or np.zeros((3, 3)), dtype=np.float64)

    def draw_confusion(ax: Any) -> None:
        top = float(confusion.max()) if confusion.size else 0.0
        ax.imshow(confusion, cmap="Blues", vmin=0.0, vmax=max(top, 1.0))
        for i in range(3):
            for j in range(3):
                ax.text(j, i, str(int(confusion[i, j])), ha="center", va="center",
                        color="white" if top and confusion[i, j] > top / 2 else "black")
        ax.set_xticks(range(3), CLASS_NAMES)
        ax.set_yticks(range(3), CLASS_NAMES)
        ax.set_xlabel("predicted")
        ax.set_ylabel("true")
        ax.set_title("Confusion matrix (model)")

    plots.append(png(draw_confusion, (4.2, 4.0)))

    if cumulative:
        def draw_pnl(ax: Any) -> None:
            for key, label in (("model", "model (sign of P(up) − P(down))"), ("always_long", "always long")):
                if key in cumulative and len(cumulative[key]):
                    x, y = _downsample(np.asarray(cumulative[key], dtype=np.float64))
                    ax.plot(x, y, label=label)
            ax.axhline(0, color="grey", lw=0.8)
            ax.set_xlabel("row (tick, in order)")
            ax.set_ylabel("cumulative P&L (bp)")
            ax.set_title("Cumulative P&L after costs")
            ax.legend(fontsize=8)

        plots.append(png(draw_pnl, (6.0, 4.0)))

    # a stored model's metrics.json "history": read as far as it is what training writes (a list of objects with numbers)
    curve = [e for e in learning_curve if isinstance(e, Mapping)] if isinstance(learning_curve, list) else []
    epochs = [_number(e.get("epoch"), float(k + 1)) for k, e in enumerate(curve)]
    train = [_number(e.get("train_loss")) for e in curve]
    val = [_number(e["validation"].get("loss")) if isinstance(e.get("validation"), Mapping) else np.nan for e in curve]
    if curve:
        def draw_curve(ax: Any) -> None:
            ax.plot(epochs, train, "o-", label="train loss")
            ax.plot(epochs, val, "s-", label="validation loss")
            ax.set_xlabel("epoch")
            ax.set_ylabel("loss (nats)")
            ax.set_title("Learning curve")
            ax.legend(fontsize=8)

        plots.append(png(draw_curve))

    preds = _predictors(summary)
    parts = [f"<h1>{html.escape(title)}</h1>"]
    scope = _scope(summary)
    if scope:
        parts.append(f"<p>{html.escape(scope)}</p>")
    parts += [f'<p class="warning"><strong>{html.escape(line)}</strong></p>' for line in headline(summary)]
    checks = summary.get("data_checks") or {}
    if isinstance(checks, Mapping) and checks:
        parts.append('<p class="note">data checks (told, not acted on: the scored ticks, the labels and the P&L '
                     'include them):</p><ul class="note">' + "".join(
                         f"<li>{html.escape(str(market))}: {html.escape(str(line))}</li>"
                         for market, lines in checks.items() for line in (lines or [])) + "</ul>")
    stock_splits = summary.get("stock_splits") or []
    if isinstance(stock_splits, list) and stock_splits:
        parts.append('<p class="note">prices adjusted for stock splits (the move taken out of the prices, the labels'
                     ' and the P&L):</p><ul class="note">' + "".join(
                         f"<li>{html.escape(str(s.get('note', '')))}</li>" for s in stock_splits
                         if isinstance(s, Mapping)) + "</ul>")
    parts.append(f"<p>{html.escape(_overview(summary))}</p>")
    base_rates = summary.get("base_rates") or {}
    if base_rates:
        parts.append(_table(["base rates", *CLASS_NAMES],
                            [["frequency", *[_fmt(base_rates.get(c)) for c in CLASS_NAMES]]]))
    parts.append('<div class="plots">' + "".join(plots) + "</div>")
    parts.append(_section("Metrics", _table(["predictor", *[label for _, label in METRICS]],
                                            [[name, *[_fmt(m.get(k)) for k, _ in METRICS]] for name, m in preds])))
    parts.append(_section("Recall per class", _table(["predictor", *CLASS_NAMES],
                                                     [[name, *[_fmt((m.get("recall") or {}).get(c))
                                                               for c in CLASS_NAMES]] for name, m in preds])))
    parts.append(_section("P&L (sign strategy, after costs)",
                          _table(["strategy", *[label for _, label in PNL_FIELDS]],
                                 [[name, *[_pnl_fmt(k, p.get(k), "—") for k, _ in PNL_FIELDS]]
                                  for name, p in _pnl_rows(summary)])
                          + "".join(f'<p class="note">{html.escape(line)}</p>' for line in pnl_lines(summary, "—"))))
    vs = summary.get("vs_baselines") or {}
    if vs:
        note = summary.get("bootstrap") or {}
        parts.append(_section("Model minus baseline (95% CI)", _table(
            ["baseline", *[label for _, label in DIFF_METRICS]],
            [[name, *[_ci_text(cells.get(k), "—") for k, _ in DIFF_METRICS]] for name, cells in vs.items()])))
        if note:
            parts.append('<p class="note">' + html.escape(
                f"{note.get('method', '')}; block length {note.get('block_length')} rows; "
                f"{note.get('note', '')}") + "</p>")
            quantile = interval_quantile_line(summary)
            if quantile:
                parts.append(f'<p class="note">{html.escape(quantile)}</p>')
    quartiles = (model.get("confidence_quartiles") or {}).get("quartiles") or []
    if quartiles:
        parts.append(_section("Model by confidence quartile (confidence = 1 − H(p)/ln 3)", _table(
            ["quartile", "confidence from", "to", "rows", "accuracy", "moving rows", "dir. accuracy"],
            [[f"Q{k + 1}", _fmt(q.get("lo")), _fmt(q.get("hi")), _fmt(q.get("count")), _fmt(q.get("accuracy")),
              _fmt(q.get("moving")), _fmt(q.get("directional_accuracy"))] for k, q in enumerate(quartiles)])))
    if model.get("reliability"):
        parts.append(_section("Direction reliability (model)", _table(
            ["q bin", "rows", "mean predicted q", "observed up frequency"],
            [[f"{_fmt(b.get('lo'), 1)}–{_fmt(b.get('hi'), 1)}", _fmt(b.get("count")), _fmt(b.get("mean_predicted")),
              _fmt(b.get("observed"))] for b in model["reliability"]])))
    confusions = [(name, m["confusion"]) for name, m in preds if m.get("confusion")]
    if confusions:
        parts.append(_section("Confusion matrices (rows true, columns predicted)", "".join(
            f"<h3>{html.escape(name)}</h3>" + _table(["true \\ predicted", *CLASS_NAMES],
                                                     [[CLASS_NAMES[i], *[_fmt(v) for v in row]]
                                                      for i, row in enumerate(matrix)])
            for name, matrix in confusions)))
    per_market = summary.get("per_market") or {}
    if per_market.get("table"):
        caption = f"{per_market.get('reported')} of {per_market.get('markets')} markets, most samples first"
        parts.append(_section("Model per market", f'<p class="note">{html.escape(caption)}</p>' + _table(
            ["market", "samples", "accuracy", "dir. accuracy", "log loss", "trades", "costs bp", "total bp"],
            [[r.get("market"), _fmt(r.get("samples")), _fmt(r.get("accuracy")), _fmt(r.get("directional_accuracy")),
              _fmt(r.get("log_loss")), _fmt(r.get("trades")), _fmt(r.get("costs_bp"), 2), _fmt(r.get("total_bp"), 2)]
             for r in per_market["table"]])))
    if curve:
        parts.append(_section("Learning curve", _table(
            ["epoch", "train loss", "validation loss"],
            [[_fmt(int(e) if e.is_integer() else e), _fmt(t), _fmt(v)] for e, t, v in zip(epochs, train, val, strict=True)])))
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
            f"<style>{_CSS}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n")
