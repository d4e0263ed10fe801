"""Command-line arguments a user can get wrong: exit code, one line on stderr naming the problem, no traceback,
nothing started or replaced."""

from __future__ import annotations

import http.server
import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cerebellar_norse import cli
from cerebellar_norse.cli import main


@pytest.fixture(autouse=True)
def _own_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith("CEREBELLAR_NORSE_") or k == "STATE_DIRECTORY":
            monkeypatch.delenv(k)
    monkeypatch.setenv("CEREBELLAR_NORSE_PATHS__STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("CEREBELLAR_NORSE_TRAINING__BOOTSTRAP_ON_FIRST_RUN", "false")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def one_clean_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("cerebellar-norse: "), err
    return lines[0]


@pytest.mark.parametrize("flag", ["--verify-data", "--validate-model"])
@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_directory_is_a_usage_error_not_serve(flag: str, value: str, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # `--verify-data "$DIR"` with DIR unset used to fall through to serving (and wrote the state dir)
    monkeypatch.setattr(cli, "_cmd_serve", lambda args: pytest.fail("serving instead of checking"))
    code, out, err = run(capsys, flag, value)
    assert code == 2
    assert flag in one_clean_line(err) and out == ""
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("host", ["", " ", "127.0.0.1\nx"])
def test_a_blank_host_is_refused_like_the_config_key(host: str, capsys: pytest.CaptureFixture[str]) -> None:
    # server.host = "" is a schema error; --host "" listened on every interface (0.0.0.0)
    code, out, err = run(capsys, "--host", host, "--validate-config")
    assert code == 1 and "server.host" in err and "Traceback" not in err
    assert "valid" not in out


@pytest.mark.parametrize("command", [["make-data", "--output", "x.csv", "--ticks", "10"], ["crossval", "--ticks", "10"]])
def test_a_negative_seed_is_a_usage_error(command: list[str], capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, *command, "--seed", "-1")
    assert code == 2 and "--seed" in one_clean_line(err)
    assert not (tmp_path / "x.csv").exists()


@pytest.mark.parametrize(("argv", "flag"), [
    (["state", "diff", "a.json", "b.json", "--tolerance", "nan"], "--tolerance"),
    (["state", "diff", "a.json", "b.json", "--tolerance", "-1"], "--tolerance"),
    (["replay", "x.csv", "--tolerance", "inf"], "--tolerance"),
    (["analyze-weights", "--threshold", "-0.5"], "--threshold"),
    (["evaluate", "x.csv", "--since", "yesterday"], "--since"),
])
def test_a_bad_value_is_a_usage_error_not_a_failed_check(argv: list[str], flag: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 1 of state diff and replay means "they differ": a typo in a value must not read as that."""
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "", (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"argument {flag}:" in lines[0] and "Traceback" not in err, err


@pytest.mark.parametrize("argv", [
    ["--since", "2024-03-10T02:30:00", "--timezone", "America/New_York"],
    ["--timezone", "America/New_York", "--since", "2024-03-10 02:30"],
])
def test_a_since_the_timezone_skips_is_a_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A time of the hour the clocks skip passed the UTC check of parsing and was refused later, with exit 1."""
    monkeypatch.setattr(cli, "_cmd_evaluate", lambda args: pytest.fail("evaluating a time that does not exist"))
    code, out, err = run(capsys, "evaluate", "x.csv", *argv)
    assert code == 2 and out == "", (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("cerebellar-norse evaluate: error: argument --since: in --timezone America/New_York, "
                               "time '2024-03-10"), err
    assert "does not exist in America/New_York: the clocks go forward by 1:00:00" in lines[0], err


def test_a_since_before_1970_in_the_timezone_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "evaluate", "x.csv", "--timezone", "+05:00", "--since", "1970-01-01T01:00")  # 20:00Z
    assert code == 2 and out == "" and "argument --since: in --timezone +05:00, time '1970-01-01T01:00'" in err, err


@pytest.mark.parametrize("since", ["2024-11-03T01:30", "2024-03-10T02:30:00-05:00", "1710052200000"])
def test_a_since_of_the_repeated_hour_or_with_an_offset_reaches_the_command(since: str,
                                                                             capsys: pytest.CaptureFixture[str],
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The hour the clocks repeat is read as its first occurrence (as in the files), not refused; a time with its own
    offset, or ms, is no wall-clock time of the zone."""
    seen: list[str] = []
    monkeypatch.setattr(cli, "_cmd_evaluate", lambda args: seen.append(args.since) or 0)
    code, _, err = run(capsys, "evaluate", "x.csv", "--timezone", "America/New_York", "--since", since)
    assert code == 0 and seen == [since], err


@pytest.mark.parametrize("command", [
    ["state", "dump", "--market", "M"],
    ["trace", "--slow", "3"],
    ["plot-market", "--market", "M", "--output", "OUT"],
])
@pytest.mark.parametrize("url", ["http://[::1", "http://host:port"])
def test_a_url_that_is_no_url_is_one_line(command: list[str], url: str, capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    argv = [str(tmp_path / "p.png") if a == "OUT" else a for a in command]
    code, _, err = run(capsys, *argv, "--url", url)
    assert code == 1 and "not a URL" in one_clean_line(err)


def test_debug_bundle_with_a_url_that_is_no_url(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "debug-bundle", "--url", "http://[::1", "--output", str(tmp_path / "b.tar.gz"))
    assert code == 1 and "Traceback" not in err and "not a URL" in err
    assert (tmp_path / "b.tar.gz").exists()  # the archive holds the rest


def test_a_token_no_header_can_carry_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "state", "dump", "--market", "M", "--url", "http://127.0.0.1:9", "--token", "tök€n")
    assert code == 1 and "token" in one_clean_line(err)


@pytest.mark.parametrize("replica", ["127.0.0.1:70000", "127.0.0.1:0", "127.0.0.1:80x", "http://[::1"])
def test_haproxy_config_and_rebalance_refuse_a_bad_replica_in_one_line(replica: str,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "haproxy-config", "--replicas", replica)
    assert code == 1 and out == "" and "replica" in one_clean_line(err)
    code, out, err = run(capsys, "rebalance", "--old", f"1={replica}", "--new", "1=127.0.0.1:9", "--dry-run")
    assert code == 1 and "replica" in one_clean_line(err)


class _OtherServer(http.server.BaseHTTPRequestHandler):
    """Not this service: JSON that is no timeline, HTML error pages."""

    def do_GET(self) -> None:
        if self.path.startswith(("/debug/requests?", "/debug/markets?")):
            body, kind, status = json.dumps({"foo": 1}).encode(), "application/json", 200
        else:
            body, kind, status = b"<!DOCTYPE HTML>\n<html>\n<body>\n<h1>Not here</h1>\n</body>\n</html>\n", "text/html", 404
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def other_server() -> Iterator[str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OtherServer)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_commands_pointed_at_another_server_say_so_in_one_line(other_server: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "trace", "--slow", "5", "--url", other_server)
    assert code == 1 and "not a request timeline" in one_clean_line(err)
    code, _, err = run(capsys, "trace", "some-id", "--url", other_server)
    assert code == 1 and "404" in one_clean_line(err)  # the HTML page on one line
    code, _, err = run(capsys, "state", "dump", "--market", "M", "--url", other_server)
    assert code == 1 and "Not here" in one_clean_line(err)
    code, _, err = run(capsys, "rebalance", "--old", f"1={other_server}", "--new", "2=127.0.0.1:9", "--dry-run")
    assert code == 1 and "not a market listing" in one_clean_line(err)


def test_make_data_writes_through_a_link_with_the_umask_mode(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "target.csv"
    target.write_text("old\n")
    link = tmp_path / "link.csv"
    link.symlink_to(target.name)
    old = os.umask(0o022)
    try:
        code, _, err = run(capsys, "make-data", "--output", str(link), "--ticks", "5", "--markets", "1")
        assert code == 0, err
        assert link.is_symlink()  # not replaced by a regular file
        assert target.read_text().startswith("timestamp,market_id,price,volume\n")
        assert target.stat().st_mode & 0o777 == 0o644
        fresh = tmp_path / "fresh.csv"
        assert run(capsys, "make-data", "--output", str(fresh), "--ticks", "5")[0] == 0
        assert fresh.stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(old)


def test_analyze_weights_names_the_file_it_could_not_read(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    f = tmp_path / "not-a-dump.txt"
    f.write_text("hello\n")
    code, _, err = run(capsys, "analyze-weights", str(f))
    assert code == 1 and str(f) in one_clean_line(err) and "stdin" not in err


def _answering(body: bytes, status: int) -> type[http.server.BaseHTTPRequestHandler]:
    class Answer(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PUT = do_POST = _answer  # noqa: N815 (the handler names http.server calls)

        def log_message(self, *args: object) -> None:
            pass

    return Answer


@pytest.mark.parametrize(("body", "status", "words"), [(b"{}", 200, "has no 'active'"), (b"[1]", 500, "HTTP 500")])
def test_rollout_to_another_server_says_so_in_one_line(body: bytes, status: int, words: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from cerebellar_norse.config import load_config
    from cerebellar_norse.neurons.topology import generate_weights
    from cerebellar_norse.training.checkpoints import ModelStore

    cfg = load_config(None)
    ModelStore(tmp_path / "state").save(generate_weights(cfg), cfg, {}, version="v1")
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _answering(body, status))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        code, _, err = run(capsys, "rollout", "v1", "--replicas", f"127.0.0.1:{srv.server_address[1]}", "--json")
    finally:
        srv.shutdown()
        srv.server_close()
    assert code == 1 and words in one_clean_line(err)


def usage_line(err: str) -> str:
    """The one line of an argparse-style usage error (``cerebellar-norse[ COMMAND]: error: …``)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and ": error: " in lines[0], err
    assert lines[0].startswith("cerebellar-norse"), err
    return lines[0]


@pytest.mark.parametrize(("argv", "words"), [
    (["--format", "json"], ["--format needs --dump-weights"]),
    (["--output", "OUT"], ["--output needs --dump-weights"]),
    (["--format", "npz", "--validate-only"], ["--format needs --dump-weights", "--validate-only"]),
    (["--output", "OUT", "make-data", "--output", "OTHER"], ["--output needs --dump-weights", "make-data"]),
    (["--host", "127.0.0.1", "--dump-schema"], ["--host means nothing to --dump-schema"]),
    (["--port", "8081", "make-data", "--output", "OTHER"], ["--port means nothing to make-data"]),
    (["--port", "8081", "state", "diff", "a.json", "b.json"], ["--port means nothing to state diff"]),
    (["replay", "x.csv", "--tolerance", "1"], ["--tolerance needs --detect-divergence"]),
    (["rebalance", "--old", "1=127.0.0.1:9", "--new", "1=127.0.0.1:9", "--dry-run", "--backend", "b"],
     ["--backend needs --haproxy-socket"]),
    (["rebalance", "--old", "1=127.0.0.1:9", "--new", "1=127.0.0.1:9", "--haproxy-socket", "s", "--switch-command", "true"],
     ["--switch-command", "--haproxy-socket"]),
])
def test_a_flag_without_its_action_is_a_usage_error(argv: list[str], words: list[str], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "_cmd_serve", lambda args: pytest.fail("serving instead of refusing"))
    names = {"OUT": tmp_path / "out", "OTHER": tmp_path / "other.csv"}
    code, out, err = run(capsys, *[str(names.get(a, a)) for a in argv])
    assert code == 2 and out == ""
    line = usage_line(err)
    assert all(w in line for w in words), line
    assert not any(p.exists() for p in names.values())


def test_host_and_port_still_serve_and_check(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[tuple[str, int]] = []
    monkeypatch.setattr(cli, "_cmd_serve", lambda args: served.append((args.host, args.port)) or 0)
    assert run(capsys, "--host", "127.0.0.1", "--port", "18601")[0] == 0
    assert served == [("127.0.0.1", 18601)]
    code, out, _ = run(capsys, "--host", "127.0.0.1", "--port", "18601", "--validate-only")
    assert code == 0 and "schema OK" in out


@pytest.mark.parametrize(("argv", "flag", "bounds"), [
    (["bench", "--ticks", "9"], "--ticks", "10..1000000"),
    (["bench", "--ticks", "1000001"], "--ticks", "10..1000000"),
    (["bench", "--reference-ticks", "0"], "--reference-ticks", "10..100000"),
    (["bench", "--reference-ticks", "100001"], "--reference-ticks", "10..100000"),
    (["crossval", "--ticks", "0"], "--ticks", "1..1000000"),
    (["crossval", "--ticks", "-5"], "--ticks", "1..1000000"),
    (["crossval", "--markets", "10001"], "--markets", "1..10000"),
    (["make-data", "--output", "OUT", "--ticks", "0"], "--ticks", "1..10000000"),
    (["make-data", "--output", "OUT", "--ticks", "10000001"], "--ticks", "1..10000000"),
    (["make-data", "--output", "OUT", "--markets", "0"], "--markets", "1..100000"),
    (["make-data", "--output", "OUT", "--markets", "1e9"], "--markets", "1..100000"),
    (["plot-market", "--market", "M", "--output", "OUT", "--ticks", "2001"], "--ticks", "1..2000"),
    (["plot-market", "--market", "M", "--output", "OUT", "--ticks", "0"], "--ticks", "1..2000"),
    (["evaluate", "x.csv", "--bootstrap", "-1"], "--bootstrap", "0..100000"),
    (["evaluate", "x.csv", "--bootstrap", "100001"], "--bootstrap", "0..100000"),
    (["rollout", "v1", "--replicas", "127.0.0.1:9", "--timeout", "0"], "--timeout", "<= 3600"),
    (["rollout", "v1", "--replicas", "127.0.0.1:9", "--timeout", "nan"], "--timeout", "<= 3600"),
    (["rebalance", "--old", "a", "--new", "b", "--timeout", "inf"], "--timeout", "<= 3600"),
])
def test_a_size_out_of_range_is_refused_while_parsing(argv: list[str], flag: str, bounds: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    out_path = tmp_path / "out"
    code, out, err = run(capsys, *[str(out_path) if a == "OUT" else a for a in argv])
    assert code == 2 and out == ""
    line = usage_line(err)
    assert f"argument {flag}:" in line and bounds in line, line
    assert not out_path.exists()


def test_plot_market_bound_is_the_ring_the_service_keeps() -> None:
    from cerebellar_norse.observability.pictures import RING_TICKS

    assert cli.PLOT_TICKS == RING_TICKS


@pytest.fixture
def silent_replica() -> Iterator[str]:
    """A server that accepts connections and never answers (a hung replica)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(16)
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"


def test_rollout_to_a_replica_that_never_answers_names_it_and_the_timeout(
        silent_replica: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cerebellar_norse.config import load_config
    from cerebellar_norse.neurons.topology import generate_weights
    from cerebellar_norse.training.checkpoints import ModelStore

    cfg = load_config(None)
    ModelStore(tmp_path / "state").save(generate_weights(cfg), cfg, {}, version="v1")
    code, _, err = run(capsys, "rollout", "v1", "--replicas", silent_replica, "--json", "--timeout", "0.5")
    line = one_clean_line(err)
    assert code == 1
    assert f"PUT {silent_replica}/models/v1: {silent_replica} gave no answer within 0.5 s" in line, line


def test_rebalance_with_a_replica_that_never_answers_names_it_and_the_timeout(
        silent_replica: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "rebalance", "--old", f"1={silent_replica}", "--new", "1=127.0.0.1:9", "--dry-run",
                       "--timeout", "0.5")
    line = one_clean_line(err)
    assert code == 1
    assert f"GET {silent_replica}/debug/markets: {silent_replica} gave no answer within 0.5 s" in line, line


def test_rollout_waits_longer_by_default_than_rebalance() -> None:
    """A rollout's replica receives, checks and stores a whole model archive before it answers: 120 s by default, as
    before --timeout existed; a rebalance moves one market's state per call: 30 s."""
    from cerebellar_norse.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["rollout", "v1", "--replicas", "127.0.0.1:9"]).timeout == 120.0
    assert parser.parse_args(["rebalance", "--old", "a", "--new", "b"]).timeout == 30.0
