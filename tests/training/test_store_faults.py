"""Faults of the model store and data files a service meets after a restore: unreadable files, a damaged ACTIVE,
a loop of symbolic links, job records read back in the order they ran."""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import pytest
import torch
from training_helpers import TINY_NEURAL, ConfigFactory

from cerebellar_norse.config import Config
from cerebellar_norse.errors import CheckpointError, DeviceMemoryError
from cerebellar_norse.neurons.topology import generate_weights
from cerebellar_norse.training.checkpoints import NOT_ACTIVATED, ModelStore, StoredModel, load_model_dir
from cerebellar_norse.training.data import DataFileNotFoundError, resolve_data_file

V1, V2 = "20240101T000000Z-aaaaaa", "20240102T000000Z-bbbbbb"
METRICS = {"validation": {"loss": 0.95}}


@pytest.fixture
def store(cfg: Config) -> ModelStore:
    s = ModelStore(Path(cfg.paths.state_dir))
    s.save(generate_weights(cfg), cfg, METRICS, version=V1)
    s.save(generate_weights(cfg), cfg, METRICS, version=V2)
    s.set_active(V1)  # a rollback: the older model is the active one
    return s


@pytest.mark.parametrize("which", ["weights.npz", "manifest.json"])
@pytest.mark.parametrize("active", [True, False])
def test_a_model_file_it_may_not_read_refuses_the_start_instead_of_falling_back(
        cfg: Config, store: ModelStore, monkeypatch: pytest.MonkeyPatch, which: str, active: bool) -> None:
    """A permission error is the operator's to fix, not damage: serving another model (or the untrained network) in
    its place would move aside the market states saved with it. The model to serve (the active one, or the newest
    once the active one is corrupt) refuses the start with the file and the errno; elsewhere it is a model that
    cannot be loaded."""
    from cerebellar_norse.errors import ModelUnreadableError, StorageError

    if not active:  # the active model is corrupt: the newest (V2) is the one the service would serve instead
        (store.root / V1 / "weights.npz").write_bytes(b"garbled")
    locked = V1 if active else V2
    real = Path.read_bytes

    def denied(path: Path) -> bytes:  # (the tests run as root, whom chmod does not stop)
        if locked in str(path) and path.name == which:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(Path, "read_bytes", denied)
    unreadable = store.root / locked / which
    with pytest.raises(ModelUnreadableError, match=r"cannot read: Permission denied \(errno 13 EACCES\)") as load:
        load_model_dir(store.root / locked)
    assert isinstance(load.value, CheckpointError) and load.value.path == str(unreadable)
    with pytest.raises(StorageError) as refused:
        store.load_for_service(cfg)
    assert str(refused.value) == (f"cannot read model file {unreadable}: Permission denied (errno 13 EACCES): the "
                                  "service does not start on a model it cannot read (nothing is moved aside): make it "
                                  "readable by the service's user (e.g. chown) and start again")
    assert refused.value.errno == errno.EACCES and refused.value.path == str(unreadable)


@pytest.mark.parametrize("damage", ["not UTF-8", "a directory"])
def test_a_damaged_active_file_is_a_degraded_fallback(cfg: Config, store: ModelStore, damage: str) -> None:
    active = store.root / "ACTIVE"
    if damage == "a directory":
        active.unlink()
        active.mkdir()
    else:
        active.write_bytes(b"\xff\xfe")
    model = store.load_for_service(cfg)
    assert model is not None and model.version == V2
    assert store.fallback is not None and "active model is unknown" in store.fallback  # /health says "degraded"
    assert "ACTIVE" not in store.versions()


def test_a_missing_active_file_serves_the_newest_saying_none_was_activated(cfg: Config, store: ModelStore) -> None:
    (store.root / "ACTIVE").unlink()
    assert store.load_for_service(cfg).version == V2  # type: ignore[union-attr]
    assert store.fallback == NOT_ACTIVATED  # /health degraded: nobody chose the model served


def test_a_loop_of_symbolic_links_is_a_clear_not_found(tmp_path: Path) -> None:
    os.symlink("loop.csv", tmp_path / "loop.csv")
    with pytest.raises(DataFileNotFoundError, match="a loop of symbolic links"):
        resolve_data_file(tmp_path, "loop.csv")


def test_the_latest_job_after_a_restart_is_the_newest_not_the_last_by_id(make_config: ConfigFactory) -> None:
    from cerebellar_norse.training.jobs import JobManager

    cfg = make_config()
    jobs = Path(cfg.paths.state_dir) / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    for job_id, created in (("ffff", "2026-11-25T10:00:00Z"), ("0000", "2026-11-25T11:00:00Z"), ("8888", "2026-11-25T10:30:00Z")):
        (jobs / f"{job_id}.json").write_text(json.dumps({"job_id": job_id, "state": "failed", "created": created}))
    mgr = JobManager(cfg, lambda version: None, lambda loss: None)
    assert mgr.latest == "0000"
    assert list(mgr.jobs) == ["ffff", "8888", "0000"]


@pytest.mark.parametrize("active", [V1, "job's"])
def test_a_job_whose_end_a_crash_cut_off_says_whether_its_model_is_active(cfg: Config, store: ModelStore,
                                                                          active: str) -> None:
    from cerebellar_norse.training.jobs import JobManager

    job_model = "20240103T000000Z-cccccc"
    store.save(generate_weights(cfg), cfg, {**METRICS, "job_id": "c0ffee"}, version=job_model)
    if active != V1:  # the service died after activating the job's model, before recording the job's end
        store.set_active(job_model)
    jobs = Path(cfg.paths.state_dir) / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    (jobs / "c0ffee.json").write_text(json.dumps({"job_id": "c0ffee", "state": "running", "created": "2026-11-25T10:00:00Z"}))
    st = JobManager(cfg, lambda version: None, lambda loss: None).get("c0ffee")
    assert st.state == "failed" and st.model_version == job_model and st.error is not None
    if active == V1:
        assert not st.activated and f"which was not activated (activate it with POST /models/{job_model}" in st.error
    else:
        assert st.activated and f"model {job_model}, which is active (models/ACTIVE names it)" in st.error
        assert "not activated" not in st.error
    record = json.loads((jobs / "c0ffee.json").read_text())
    assert record["state"] == "failed" and record["activated"] is st.activated


def test_a_temporary_active_file_left_by_a_killed_writer_is_removed_at_the_next_start(cfg: Config, store: ModelStore) -> None:
    left = store.root / ".ACTIVE.k1ll3d.tmp"  # as atomic_write_bytes names it: killed between its write and its rename
    left.write_text(V2 + "\n")
    old = time.time() - 3600  # an hour ago: no live writer takes that long
    os.utime(left, (old, old))
    live = store.root / ".ACTIVE.wr1t1ng.tmp"  # a writer beside the service, between its write and its rename
    live.write_text(V2 + "\n")
    model = store.load_for_service(cfg)
    assert model is not None and model.version == V1 and store.fallback is None
    assert not left.exists() and live.exists()
    assert (store.root / "ACTIVE").read_text() == V1 + "\n"


def full_disk(path: Path, data: bytes) -> None:
    """``atomic_write_bytes`` on a full disk."""
    raise OSError(errno.ENOSPC, "No space left on device", str(path))


def test_a_job_record_a_full_disk_refuses_is_logged_once_kept_in_memory_and_written_when_space_returns(
        make_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A job that starts and fails on a full disk: 'cannot write job record' was logged for its start and again for
    its end, and after a restart the job was gone. Now: one ERROR, the job answered from memory, and its failed
    record written once the disk takes it (here by the next checkpoint's call), so a restart knows it."""
    import logging

    from cerebellar_norse.training import jobs as jobs_mod
    from cerebellar_norse.training.jobs import JobManager, JobStatus

    cfg = make_config()
    mgr = JobManager(cfg, lambda version: None, lambda loss: None)
    real = jobs_mod.atomic_write_bytes

    monkeypatch.setattr(jobs_mod, "atomic_write_bytes", full_disk)
    job = JobStatus(job_id="full1", state="running", files=["t.csv"])
    mgr.jobs[job.job_id] = job
    with caplog.at_level(logging.DEBUG, logger="cerebellar_norse.training"):
        mgr._write_record(job)  # as start() writes it
        mgr._finish(job, "failed", "cannot write the model: No space left on device")
        mgr.write_pending()  # a checkpoint's call while the disk is still full: no line
    said = [r.getMessage() for r in caplog.records if "cannot write job record" in r.getMessage()]
    assert len(said) == 1, said
    record = mgr.jobs_dir / "full1.json"
    assert said[0].startswith(f"cannot write job record {record}: No space left on device (errno 28 ENOSPC); the "
                              "job's record is kept in memory (GET /training/status/full1 answers it)")
    assert mgr.get("full1").state == "failed" and not record.exists()
    assert "full1" not in JobManager(cfg, lambda version: None, lambda loss: None).jobs  # (a restart now forgets it)

    monkeypatch.setattr(jobs_mod, "atomic_write_bytes", real)  # space is back
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cerebellar_norse.training"):
        mgr.write_pending()
    assert "job records written again" in caplog.text
    again = JobManager(cfg, lambda version: None, lambda loss: None).get("full1")
    assert (again.state, again.error) == ("failed", "cannot write the model: No space left on device")


def test_a_job_record_a_full_disk_refused_is_written_with_the_next_job_record(make_config: ConfigFactory,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from cerebellar_norse.training import jobs as jobs_mod
    from cerebellar_norse.training.jobs import JobManager, JobStatus

    cfg = make_config()
    mgr = JobManager(cfg, lambda version: None, lambda loss: None)
    real = jobs_mod.atomic_write_bytes

    monkeypatch.setattr(jobs_mod, "atomic_write_bytes", full_disk)
    first = JobStatus(job_id="first1", state="running", files=["t.csv"])
    mgr.jobs[first.job_id] = first
    mgr._finish(first, "failed", "no space")
    monkeypatch.setattr(jobs_mod, "atomic_write_bytes", real)
    second = JobStatus(job_id="second2", state="running", files=["t.csv"])
    mgr.jobs[second.job_id] = second
    mgr._write_record(second)
    again = JobManager(cfg, lambda version: None, lambda loss: None).jobs
    assert again["first1"].state == "failed" and again["first1"].error == "no space" and "second2" in again


def test_the_service_writes_refused_job_records_after_its_next_checkpoint(make_config: ConfigFactory,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The periodic checkpoint is the service's sign that the state dir takes files again: it writes the job records
    a full disk refused."""
    import asyncio

    from cerebellar_norse.api import lifecycle
    from cerebellar_norse.api.server import build_service
    from cerebellar_norse.ticks import Tick
    from cerebellar_norse.training import jobs as jobs_mod
    from cerebellar_norse.training.jobs import JobStatus

    state = build_service(make_config(neural=TINY_NEURAL, training={"bootstrap_on_first_run": False}))
    try:
        lifecycle.prepare_state(state)
        assert state.jobs is not None and state.durability is not None
        real = jobs_mod.atomic_write_bytes

        monkeypatch.setattr(jobs_mod, "atomic_write_bytes", full_disk)
        job = JobStatus(job_id="late1", state="running", files=["t.csv"])
        state.jobs.jobs[job.job_id] = job
        state.jobs._finish(job, "failed", "no space")
        monkeypatch.setattr(jobs_mod, "atomic_write_bytes", real)

        async def tick_and_checkpoint() -> bool:
            await state.engine.submit(Tick(100.0, 10.0, 1_640_995_200_000, "M"))
            assert state.durability is not None
            return await state.durability.checkpoint()

        assert asyncio.run(tick_and_checkpoint())
        assert json.loads((state.jobs.jobs_dir / "late1.json").read_text())["state"] == "failed"
    finally:
        if state.durability is not None:
            state.durability.close(save=False)


def test_a_job_record_whose_write_a_crash_cut_off_leaves_no_temporary_file_after_the_restart(
        make_config: ConfigFactory) -> None:
    """A kill between the creation of ``jobs/.<id>.json.<random>.tmp`` and its rename (the record's fsync, say): the
    next start removes the temporary file and reads the record as it was before (it stayed in the state dir for good)."""
    from cerebellar_norse.training.jobs import JobManager

    cfg = make_config()
    jobs = Path(cfg.paths.state_dir) / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    (jobs / "abcd.json").write_text(json.dumps({"job_id": "abcd", "state": "failed", "created": "2026-11-25T10:00:00Z"}))
    (jobs / ".abcd.json.x1y2z3.tmp").write_text('{"job_id": "abcd", "sta')  # cut off by the crash
    (jobs / ".ef01.json.q9w8e7.tmp").write_text("")  # a new job's first record: created, nothing written yet
    mgr = JobManager(cfg, lambda version: None, lambda loss: None)
    assert sorted(p.name for p in jobs.iterdir()) == ["abcd.json"]
    assert list(mgr.jobs) == ["abcd"] and mgr.get("abcd").state == "failed"


# torch's own class (torch.cuda.OutOfMemoryError is the same one), as CUDA raises it: a RuntimeError, no MemoryError
CUDA_OOM = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 "
                                  "GiB of which 1.06 GiB is free.\nIf reserved but unallocated memory is large try setting"
                                  " PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")


# the CUDA backend's own words for the same (its pool or a tensor it places refused by the device)
DEVICE_OOM = DeviceMemoryError("cannot reserve performance.memory_pool_size 64.00MB (67108864 bytes) on cuda:0: the "
                               "device is out of memory; lower memory_pool_size or free the GPU")


def torch_cpu_allocation_failure() -> RuntimeError:
    """torch's CPU allocator failing, for real (1 EiB is beyond any address space): a RuntimeError, no MemoryError."""
    try:
        torch.empty(1 << 60, dtype=torch.uint8)
    except RuntimeError as exc:
        return exc
    raise AssertionError("torch allocated 1 EiB")


@pytest.mark.parametrize("fault", [MemoryError("Unable to allocate 64.0 MiB"), torch_cpu_allocation_failure(),
                                   OSError(errno.EMFILE, "Too many open files"),
                                   OSError(errno.ENFILE, "Too many open files in system"),
                                   OSError(errno.ENOMEM, "Cannot allocate memory"),
                                   OSError(errno.EAGAIN, "Resource temporarily unavailable"),
                                   RuntimeError("can't start new thread"), CUDA_OOM, DEVICE_OOM], ids=repr)
def test_a_host_failure_building_the_engine_of_the_model_to_serve_refuses_the_start(
        cfg: Config, store: ModelStore, fault: Exception) -> None:
    """The host was short of memory, a descriptor or a thread while the active model's engine was built: the next
    model would build (the failure passes), but serving it would move aside the market states saved with the active
    one. The start is refused naming the model, the cause and what to do; nothing is refused as unusable."""
    from cerebellar_norse.errors import EngineHostError, StorageError

    built: list[str] = []

    def build_once(model: StoredModel) -> None:
        version = model.version
        if not built:
            built.append(version)
            raise fault
        built.append(version)

    with pytest.raises(EngineHostError) as refused:
        store.load_for_service(cfg, build_once)
    assert built == [V1]  # no other model was tried
    assert isinstance(refused.value, StorageError) and refused.value.path == str(store.root / V1)
    text = str(refused.value)
    assert text.startswith(f"cannot build the engine of model {V1} ({store.root / V1}): ")
    assert "nothing is moved aside" in text and "start again" in text
    assert refused.value.errno == (fault.errno if isinstance(fault, OSError) else None)
    if isinstance(fault, RuntimeError) and "DefaultCPUAllocator" in str(fault):
        assert ": out of memory (DefaultCPUAllocator: can't allocate memory: you tried to allocate" in text, text
    if fault is CUDA_OOM:  # its first line only: the allocator's advice follows on lines of its own
        assert ": out of GPU memory (OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB." in text, text
        assert "\n" not in text
    if fault is DEVICE_OOM:
        assert ": out of GPU memory (cannot reserve performance.memory_pool_size 64.00MB" in text, text
    assert store.active_version() == V1 and (store.root / V1 / "weights.npz").is_file()


def test_a_model_whose_engine_cannot_be_built_for_a_reason_of_its_own_is_still_refused(
        cfg: Config, store: ModelStore) -> None:
    """An error that says something about the model (here a ValueError) is no host failure: the next model is
    served, degraded, as before."""
    def misfit(model: StoredModel) -> None:
        if model.version == V1:
            raise ValueError("weights do not fit the kernel")

    served = store.load_for_service(cfg, misfit)
    assert served is not None and served.version == V2
    assert store.fallback is not None and "cannot be served (ValueError: weights do not fit the kernel)" in store.fallback


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE, errno.ENOMEM])
def test_activating_a_model_the_host_has_no_descriptor_or_memory_to_read_is_a_capacity_refusal(
        cfg: Config, store: ModelStore, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    """Reading the model failed for want of a descriptor or memory: 503 capacity with Retry-After (try again), not 422
    as a corrupt model; a permission error stays a model that cannot be loaded (422)."""
    from cerebellar_norse.api.modelswap import verified_model
    from cerebellar_norse.errors import CapacityError

    real = Path.read_bytes

    def short(path: Path) -> bytes:
        if V2 in str(path) and path.name == "weights.npz":
            raise OSError(code, os.strerror(code), str(path))
        return real(path)

    monkeypatch.setattr(Path, "read_bytes", short)
    with pytest.raises(CapacityError) as refused:
        verified_model(store, V2, cfg.neural)
    assert not isinstance(refused.value, CheckpointError)
    assert refused.value.retry_after_s == 5.0
    assert f"(errno {code} {errno.errorcode[code]})" in str(refused.value) and "activate it again" in str(refused.value)

    def denied(path: Path) -> bytes:
        if V2 in str(path) and path.name == "weights.npz":
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(CheckpointError) as bad:
        verified_model(store, V2, cfg.neural)
    assert bad.value.field == "version"


@pytest.mark.parametrize("what", ["file", "dangling link"])
def test_a_file_where_the_job_records_go_is_moved_aside_at_start_and_named_by_verify_data(
        make_config: ConfigFactory, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
        what: str) -> None:
    """A file called ``jobs`` in the state dir made every job record fail (`File exists`), said as a record waiting for
    room in the state dir that never came, while --verify-data said OK."""
    import logging

    from cerebellar_norse.training.commands import cmd_verify_data
    from cerebellar_norse.training.jobs import JobManager

    cfg = make_config()
    state = Path(cfg.paths.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    jobs = state / "jobs"
    if what == "file":
        jobs.write_text("not a directory\n")
    else:
        jobs.symlink_to(state / "gone")
    (state / "market_state.bin").write_bytes(b"")  # a state dir as --verify-data finds one
    assert cmd_verify_data(str(state)) == 1
    assert f"{jobs}: not a directory (the job records' directory goes there)" in capsys.readouterr().err
    with caplog.at_level(logging.WARNING):
        JobManager(cfg, lambda version: None, lambda loss: None)
    (moved,) = state.glob("jobs.misplaced-*")
    assert f"moved aside to {moved}" in caplog.text and not jobs.exists() and not jobs.is_symlink()
    said = "a regular file" if what == "file" else "a link to nothing"
    assert f"{jobs} is {said}, not the directory of the job records" in caplog.text
