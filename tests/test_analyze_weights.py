"""``cerebellar-norse analyze-weights``: statistics, saturation, dead units, drift, the PNG, and stdin dumps."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from network_sizes import SMALL_NEURAL

from cerebellar_norse.cli import main
from cerebellar_norse.config import load_config
from cerebellar_norse.neurons.topology import generate_weights
from cerebellar_norse.observability.pictures import PNG_MAGIC, analyze, dead_units, drift
from cerebellar_norse.training.checkpoints import ModelStore


@pytest.fixture
def config_path(tmp_path: Path, write_toml: Callable[[str], Path]) -> Path:
    neural = "\n".join(f"{k} = {v}" for k, v in SMALL_NEURAL.items())
    return write_toml(f'[neural]\n{neural}\n\n[paths]\nstate_dir = "{tmp_path / "state"}"\n')


def run(capsys: pytest.CaptureFixture[str], config: Path, *argv: str, stdin: bytes | None = None,
        monkeypatch: pytest.MonkeyPatch | None = None) -> tuple[int, str, str]:
    if stdin is not None:
        assert monkeypatch is not None
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = main(["--config", str(config), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_planted_dead_purkinje_cell_is_reported(config_path: Path) -> None:
    w = generate_weights(load_config(config_path))
    assert dead_units(w)["purkinje_no_input"]["count"] == 0
    w.pf_w[3] = 0.0
    report = analyze(w, "planted")
    assert report["dead_units"]["purkinje_no_input"] == {"count": 1, "indices": [3]}
    assert report["layers"]["parallel_fibre_purkinje"]["zero_fraction"] > 0
    w.w_out[:, 2] = 0.0
    assert dead_units(w)["dcn_unread"]["indices"] == [2]


def test_saturation_counts_a_pile_up_at_the_bounds_not_a_constant_layer(config_path: Path) -> None:
    w = generate_weights(load_config(config_path))
    top = float(w.pf_w.max())
    w.pf_w[:, :4] = top  # clipped at w_max
    sat = analyze(w, "clipped")["layers"]["parallel_fibre_purkinje"]["saturation"]
    assert sat["at_max"] >= 4 * w.pf_w.shape[0]
    assert sat["fraction"] >= 4 / w.pf_w.shape[1]
    bias = analyze(w, "x")["layers"]["purkinje_bias"]["saturation"]  # np.full at start
    assert bias["constant"] and bias["fraction"] == 0.0


def test_drift_is_zero_against_itself_and_positive_against_a_perturbed_copy(config_path: Path) -> None:
    w = generate_weights(load_config(config_path))
    same = drift(w, w.copy())
    assert all(v == 0.0 for v in same["layers"].values()) and not same["topology_changed"]
    other = w.copy()
    other.pf_w *= 1.1
    d = drift(other, w)
    assert d["layers"]["parallel_fibre_purkinje"] == pytest.approx(0.1, rel=1e-5)
    assert d["layers"]["dcn_readout"] == 0.0


def test_command_on_stored_models_with_compare_and_png(config_path: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    cfg = load_config(config_path)
    store = ModelStore(Path(cfg.paths.state_dir))
    w = generate_weights(cfg)
    base = store.save(w, cfg, {}, version="20240101T000000Z-aaaaaa")
    changed = w.copy()
    changed.pf_w[5] = 0.0
    changed.w_md *= 0.5
    new = store.save(changed, cfg, {}, version="20240102T000000Z-bbbbbb")
    png = tmp_path / "pictures" / "w.png"  # a directory not made yet: made, as every command's --output does
    code, out, _ = run(capsys, config_path, "analyze-weights", "--model", new, "--compare", base, "--output", str(png),
                       "--json")
    assert code == 0
    report = json.loads(out)
    assert report["model_version"] == new
    assert report["dead_units"]["purkinje_no_input"]["indices"] == [5]
    assert report["drift"]["against"] == base
    assert report["drift"]["layers"]["mossy_dcn"] == pytest.approx(0.5)
    assert report["drift"]["layers"]["dcn_readout"] == 0.0
    assert png.read_bytes()[:8] == PNG_MAGIC
    code, out, _ = run(capsys, config_path, "analyze-weights", "--model", base, "--compare", base)
    assert code == 0
    assert "drift against" in out and "purkinje_no_input" in out
    drift_lines = out.split("drift against", 1)[1].splitlines()[1:]
    assert drift_lines and all(line.split()[-1] == "0" for line in drift_lines)
    code, _, err = run(capsys, config_path, "analyze-weights", "--model", "no-such-version")
    assert code == 1 and "no-such-version" in err


def test_stdin_takes_every_dump_weights_format(config_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def dump(*fmt: str) -> bytes:
        out = io.BytesIO()
        wrapper = io.TextIOWrapper(out, write_through=True)
        monkeypatch.setattr("sys.stdout", wrapper)
        assert main(["--config", str(config_path), "--dump-weights", *fmt]) == 0
        wrapper.flush()
        data = out.getvalue()
        wrapper.detach()
        monkeypatch.undo()
        return data

    npz = dump("--format", "npz")
    code, out, _ = run(capsys, config_path, "analyze-weights", "-", "--json", stdin=npz, monkeypatch=monkeypatch)
    assert code == 0
    full: dict[str, Any] = json.loads(out)
    assert full["source"] == "arrays" and "dead_units" in full
    for fmt in (("--format", "json"), ()):
        code, out, _ = run(capsys, config_path, "analyze-weights", "-", "--json", stdin=dump(*fmt), monkeypatch=monkeypatch)
        assert code == 0, fmt
        stats = json.loads(out)
        assert stats["source"] == "statistics" and stats["model_version"].startswith("untrained")
        for name, s in stats["layers"].items():
            assert s["mean"] == pytest.approx(full["layers"][name]["mean"], rel=1e-4, abs=1e-9)
    code, out, _ = run(capsys, config_path, "analyze-weights", "-", stdin=dump(), monkeypatch=monkeypatch)
    assert code == 0 and "statistics only" in out
    code, _, err = run(capsys, config_path, "analyze-weights", "-", "--output", "x.png", stdin=dump(),
                       monkeypatch=monkeypatch)
    assert code == 1 and "statistics only" in err
    code, _, err = run(capsys, config_path, "analyze-weights", "-", stdin=b"garbage", monkeypatch=monkeypatch)
    assert code == 1 and "--dump-weights" in err
    assert np.isfinite(full["layers"]["dcn_readout"]["std"])
