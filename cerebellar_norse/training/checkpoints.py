"""Model store: ``<state_dir>/models/<version>/`` directories written atomically.

A model directory holds:

* ``weights.npz`` – every array of :class:`~cerebellar_norse.neurons.topology.Weights`;
* ``config.json`` – the ``[neural]`` section it was trained with (its network shape);
* ``metrics.json`` – validation metrics, history, data summary;
* ``manifest.json`` – SHA-256 and size of each file above, the version and creation time, and the format
  (:data:`MODEL_FORMAT`; none in models stored before it, which are format 1).

It is written into ``models/.tmp-<version>-<pid>/`` (each file fsynced), then renamed
to ``models/<version>/`` and the directory fsynced: a killed writer leaves only a
``.tmp-`` directory, which is ignored and removed at the next start. The active
model is named in ``models/ACTIVE`` (written atomically: a writer killed before its
rename leaves a ``.ACTIVE.*.tmp`` file, removed at the next start too). Versions sort by time.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config import Config, NeuralConfig
from ..errors import (
    CerebellarNorseError,
    CheckpointError,
    EngineHostError,
    InputError,
    ModelUnreadableError,
    NewerFormatError,
    StorageError,
    host_shortage_reason,
    quoted,
)
from ..neurons.parameters import network_shape
from ..neurons.topology import Weights, generate_weights
from ..storage import (
    atomic_write_bytes,
    fsync_dir,
    load_checksummed_json,
    read_file,
    read_refused,
    retrying,
    sha256_bytes,
)

if TYPE_CHECKING:
    from ..engine.persistence import StateFile

log = logging.getLogger("cerebellar_norse.models")

FILES = ("weights.npz", "config.json", "metrics.json")
MANIFEST = "manifest.json"
# The format of a model directory (its manifest's ``format``; a manifest without one, written before it, is 1). Raise it
# when a change means an older version would misread the model: that version then refuses it, naming the format,
# instead of serving it.
MODEL_FORMAT = 1
ACTIVE = "ACTIVE"
MODELS_DIR = "models"  # the model store's directory in a state dir
# ModelStore.fallback when models are stored but none was ever activated: the newest valid one is served
NOT_ACTIVATED = "no model was activated (models/ACTIVE is missing or empty; models stored with activation off are not active)"
WEIGHT_FIELDS = ("mg_idx", "mg_w", "pf_pre", "pf_w", "pc_bias", "w_md", "w_pd", "dcn_bias", "w_out", "pf_ptr", "pf_post", "pf_src")
# The [neural] keys that define the network's shape and dynamics: a model is only
# loadable into a service whose config agrees on them.
HEAD_FIELDS = ("head_gain", "head_bias")
# How long (ns) after the models directory last changed before a listing of it is kept: a change within the
# filesystem's timestamp granularity (a clock tick; 2 s on FAT) can leave its st_mtime_ns as it was.
SETTLED_NS = 2_000_000_000
# How long (ns) after its last change a ``.ACTIVE.*.tmp`` file counts as left by a killed writer: writing ACTIVE (a
# few bytes, one fsync, a rename) takes far less, so a live writer's temporary file is never removed.
STALE_ACTIVE_TMP_NS = 60_000_000_000
SHAPE_KEYS = ("mossy_size", "granule_size", "granule_dendrites", "purkinje_size", "connections_per_neuron", "dcn_size",
              "steps_per_tick", "dt_ms", "precision")


def new_version() -> str:
    """A sortable, unique model version: UTC time plus a short random suffix."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


def weights_to_bytes(w: Weights) -> bytes:
    """Serialise weights as an ``.npz`` (no pickle)."""
    buf = io.BytesIO()
    arrays = {k: getattr(w, k) for k in WEIGHT_FIELDS}
    np.savez(buf, golgi_init=np.array(w.golgi_init), head_gain=w.head_gain, head_bias=w.head_bias, **arrays)
    return buf.getvalue()


def weights_from_bytes(data: bytes, where: str) -> Weights:
    """Deserialise and verify weights written by :func:`weights_to_bytes` (CheckpointError naming ``where``)."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as exc:
        raise CheckpointError(f"unreadable weights: {exc}", where) from None
    missing = [k for k in (*WEIGHT_FIELDS, "golgi_init") if k not in arrays]
    if missing:
        raise CheckpointError(f"weights lack {', '.join(missing)}", where)
    for k in (*HEAD_FIELDS, "golgi_init"):
        if k in arrays and not _is_real_float(arrays[k]):
            raise CheckpointError(f"{k} has dtype {arrays[k].dtype}, expected a floating-point type", where)
    if arrays["golgi_init"].size != 1:
        raise CheckpointError(f"golgi_init has shape {arrays['golgi_init'].shape}, expected one number", where)
    head = {k: np.asarray(arrays[k], dtype=np.float64) for k in HEAD_FIELDS if k in arrays}  # absent in older models: identity
    w = Weights(**{k: arrays[k] for k in WEIGHT_FIELDS}, golgi_init=float(arrays["golgi_init"].reshape(())), **head)
    check_weights(w, where)
    return w


INDEX_FIELDS = ("mg_idx", "pf_pre", "pf_ptr", "pf_post", "pf_src")
FLOAT_FIELDS = ("mg_w", "pf_w", "pc_bias", "w_md", "w_pd", "dcn_bias", "w_out", *HEAD_FIELDS)


def check_weights(w: Weights, where: str) -> None:
    """Shape, dtype, value and index checks of a weights object (CheckpointError naming ``where``).

    The kernels index without bounds checks, so every index array is verified against
    the arrays it indexes (G granule cells, M mossy fibres, P Purkinje cells, C inputs
    per Purkinje cell, N DCN cells, K classes; all counts of cells or synapses):

    * ``mg_idx`` (G, D): mossy fibres, ``0 <= mg_idx < M``, distinct within a granule cell;
    * ``pf_pre`` (P, C): granule cells, ``0 <= pf_pre < G``, distinct within a Purkinje cell;
    * ``pf_ptr`` (G + 1,): CSR row pointers, ``pf_ptr[0] == 0``, non-decreasing, ``pf_ptr[G] == P * C``;
    * ``pf_src`` (P * C,): a permutation of ``0 … P*C - 1`` (flat positions in ``pf_w``), each
      entry in the row of its own granule cell: ``pf_pre.flat[pf_src[e]] == g`` for
      ``pf_ptr[g] <= e < pf_ptr[g + 1]``;
    * ``pf_post`` (P * C,): ``0 <= pf_post < P`` and ``pf_post == pf_src // C`` (the Purkinje
      cell of that synapse).

    Messages name the array and its first bad position and value. Numpy only (vectorised):
    a model of millions of synapses takes a fraction of a second.
    """
    for k in (*INDEX_FIELDS, *FLOAT_FIELDS):
        a = getattr(w, k)
        if not isinstance(a, np.ndarray):
            raise CheckpointError(f"{k} is a {type(a).__name__}, expected an array", where)
    for k in INDEX_FIELDS:
        a = getattr(w, k)
        if not np.issubdtype(a.dtype, np.integer):
            raise CheckpointError(f"{k} has dtype {a.dtype}, expected an integer type (it holds indices)", where)
    for k in FLOAT_FIELDS:
        if not _is_real_float(getattr(w, k)):
            raise CheckpointError(f"{k} has dtype {getattr(w, k).dtype}, expected a floating-point type", where)
    for k in ("mg_idx", "pf_pre", "w_md", "w_out"):
        if getattr(w, k).ndim != 2:
            raise CheckpointError(f"{k} has shape {getattr(w, k).shape}, expected two dimensions", where)
    g, d = w.mg_idx.shape
    p, c = w.pf_pre.shape
    n, m = w.w_md.shape
    nnz = p * c
    expect = {"mg_w": (g, d), "pf_w": (p, c), "pc_bias": (p,), "w_pd": (n, p), "dcn_bias": (n,), "pf_ptr": (g + 1,),
              "pf_post": (nnz,), "pf_src": (nnz,)}
    for k, shape in expect.items():
        if getattr(w, k).shape != shape:
            raise CheckpointError(f"{k} has shape {getattr(w, k).shape}, expected {shape}", where)
    if w.w_out.shape[1] != n:
        raise CheckpointError(f"w_out has shape {w.w_out.shape}, expected (K, {n})", where)
    for k in HEAD_FIELDS:
        if getattr(w, k).shape != (w.w_out.shape[0],):
            raise CheckpointError(f"{k} has shape {getattr(w, k).shape}, expected ({w.w_out.shape[0]},)", where)
    for k in FLOAT_FIELDS:
        bad = np.flatnonzero(~np.isfinite(getattr(w, k)))
        if bad.size:
            raise CheckpointError(f"{k} contains non-finite values (first {_at(k, getattr(w, k), int(bad[0]))})", where)
    if not np.isfinite(w.golgi_init):
        raise CheckpointError(f"golgi_init is {w.golgi_init}, expected a finite number", where)

    mg_idx = _in_range("mg_idx", w.mg_idx, m, "mossy fibres (M, the columns of w_md)", where)
    _distinct_rows("mg_idx", mg_idx, "granule cell", "mossy fibre", where)
    pf_pre = _in_range("pf_pre", w.pf_pre, g, "granule cells (G, the rows of mg_idx)", where)
    _distinct_rows("pf_pre", pf_pre, "Purkinje cell", "granule cell", where)

    ptr = w.pf_ptr
    if ptr[0] != 0:
        raise CheckpointError(f"pf_ptr[0] = {ptr[0]}, expected 0 (CSR row pointers start at 0)", where)
    if ptr[-1] != nnz:
        raise CheckpointError(f"pf_ptr[{g}] = {ptr[-1]}, expected {nnz} (P * C parallel-fibre synapses)", where)
    down = np.flatnonzero(ptr[1:] < ptr[:-1])
    if down.size:
        i = int(down[0]) + 1
        raise CheckpointError(f"pf_ptr[{i}] = {ptr[i]} is less than pf_ptr[{i - 1}] = {ptr[i - 1]} "
                              "(CSR row pointers never decrease)", where)
    ptr = ptr.astype(np.int64)  # in [0, nnz] now

    src = _in_range("pf_src", w.pf_src, nnz, "parallel-fibre synapses (P * C, the entries of pf_w)", where)
    counts = np.bincount(src, minlength=nnz)
    twice = np.flatnonzero(counts > 1)
    if twice.size:
        v = int(twice[0])
        at = np.flatnonzero(src == v)
        raise CheckpointError(f"pf_src names synapse {v} more than once (pf_src[{at[0]}] and pf_src[{at[1]}]); "
                              "it must be a permutation of the parallel-fibre synapses", where)
    post = _in_range("pf_post", w.pf_post, p, "Purkinje cells (P, the rows of pf_pre)", where)
    bad = np.flatnonzero(post != src // c) if c else np.array([], dtype=np.int64)
    if bad.size:
        e = int(bad[0])
        raise CheckpointError(f"pf_post[{e}] = {post[e]} but pf_src[{e}] = {src[e]} is a synapse of Purkinje cell "
                              f"{src[e] // c}", where)
    row = np.repeat(np.arange(g, dtype=np.int64), np.diff(ptr))
    bad = np.flatnonzero(pf_pre.reshape(-1)[src] != row)
    if bad.size:
        e = int(bad[0])
        raise CheckpointError(f"pf_src[{e}] = {src[e]} is a synapse of granule cell {pf_pre.reshape(-1)[src[e]]} "
                              f"(pf_pre), but entry {e} lies in the CSR row of granule cell {row[e]} (pf_ptr)", where)


def _is_real_float(a: np.ndarray) -> bool:
    return isinstance(a, np.ndarray) and np.issubdtype(a.dtype, np.floating)


def _at(name: str, a: np.ndarray, flat: int) -> str:
    """``name[i, j] = value`` of the element at flat position ``flat``."""
    pos = ", ".join(str(int(i)) for i in np.unravel_index(flat, a.shape))
    return f"{name}[{pos}] = {a.reshape(-1)[flat]}"


def _in_range(name: str, a: np.ndarray, hi: int, what: str, where: str) -> np.ndarray:
    """``a`` as int64 after checking ``0 <= a < hi`` (CheckpointError naming the first index out of range)."""
    bad = np.flatnonzero((a < 0) | (a >= hi))
    if bad.size:
        raise CheckpointError(f"{_at(name, a, int(bad[0]))} is out of range: there are {hi} {what}, "
                              f"so 0 <= {name} < {hi}", where)
    return a.astype(np.int64, copy=False)


def _distinct_rows(name: str, a: np.ndarray, row_of: str, entry: str, where: str) -> None:
    """Refuse a (rows, k) index array with a row that names the same ``entry`` twice."""
    if a.shape[1] < 2:
        return
    s = np.sort(a, axis=1)
    dup = np.flatnonzero((s[:, 1:] == s[:, :-1]).any(axis=1))
    if dup.size:
        r = int(dup[0])
        v = int(s[r, 1:][s[r, 1:] == s[r, :-1]][0])
        raise CheckpointError(f"{name}[{r}] names {entry} {v} twice ({row_of} {r}); the entries of a row must differ",
                              where)


@dataclass(frozen=True)
class StoredModel:
    """A verified model directory."""

    version: str
    path: Path
    weights: Weights
    neural: dict[str, Any]
    metrics: dict[str, Any]

    @property
    def score(self) -> float | None:
        """Validation loss (lower is better), when recorded."""
        v = self.metrics.get("validation", {}).get("loss")
        return float(v) if isinstance(v, (int, float)) else None


def shape_mismatch(neural: dict[str, Any], cfg: NeuralConfig) -> list[str]:
    """Keys of ``[neural]`` on which a model and a config disagree."""
    current = cfg.model_dump(mode="json")
    return [k for k in SHAPE_KEYS if neural.get(k) != current.get(k)]


VERSION_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def check_version(version: str) -> None:
    """Raise InputError unless ``version`` is a safe directory name (letters, digits, ``-_.``; not starting with ``.``)."""
    if not version or len(version) > 128 or version.startswith(".") or not set(version) <= VERSION_CHARS:
        raise InputError(f"invalid model version {version!r} (letters, digits, '-', '_', '.'; at most 128; not "
                         f"starting with '.')", "version")
    if version == ACTIVE:  # the name of the file naming the active model: a model directory there breaks activation
        raise InputError(f"invalid model version {version!r}: {ACTIVE} is reserved (models/{ACTIVE} names the active "
                         f"model)", "version")


@dataclass(frozen=True)
class ModelSummary:
    """What a listing says of one stored model: its metrics when it verified (``error`` None), else why it did not."""

    version: str
    metrics: dict[str, Any]
    error: str | None = None


FileIdentity = tuple[tuple[str, int, int, int, int], ...]  # (name, inode, size, st_mtime_ns, st_ctime_ns) per entry


def _identity(path: Path) -> tuple[FileIdentity, int] | None:
    """The identity of a model directory's entries and the newest of their change times (ns); None when it cannot be
    listed or an entry not stat-ed."""
    try:
        out = []
        for entry in os.scandir(path):
            st = entry.stat()
            out.append((entry.name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        st = path.stat()
    except OSError:
        return None
    out.append((".", st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(sorted(out)), max(max(e[3], e[4]) for e in out)


class ModelStore:
    """The models directory of a state dir."""

    def __init__(self, state_dir: Path) -> None:
        self.root = Path(state_dir) / MODELS_DIR
        self.fallback: str | None = None  # set by load_for_service: why the active model is not the one served
        self.active_problem: str | None = None  # set by active_version: why models/ACTIVE names no version
        self.refused: dict[str, str] = {}  # set by load_for_service: the versions it passed over, and why
        self._listing: tuple[tuple[int, int], list[str]] | None = None  # (inode, st_mtime_ns) of root, versions()
        self._summaries: dict[str, tuple[FileIdentity, ModelSummary]] = {}  # summaries(): by version

    def versions(self) -> list[str]:
        """Stored versions (complete directories), oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != ACTIVE)

    def versions_now(self) -> list[str]:
        """:meth:`versions`, listed again only when the models directory changed since the last listing (its inode or
        ``st_mtime_ns``: one stat per call); models stored by another process are seen as soon as they are complete.

        A model is stored by renaming its directory into ``root``, which changes ``root``'s mtime. A listing taken
        within ``SETTLED_NS`` of that mtime is not kept: a later change in the same timestamp tick may not show.
        """
        try:
            st = self.root.stat()
        except FileNotFoundError:
            self._listing = None
            return []
        key = (st.st_ino, st.st_mtime_ns)
        if self._listing is not None and self._listing[0] == key:
            return list(self._listing[1])
        stored = self.versions()
        settled = time.time_ns() - st.st_mtime_ns >= SETTLED_NS
        self._listing = (key, stored) if settled else None
        return list(stored)

    def summaries(self) -> list[ModelSummary]:
        """Every stored model, verified (:meth:`load`): its metrics, or why it is invalid; oldest first.

        A model's verdict is remembered while its directory's entries keep their identity (inode, size, modification
        and change times): a stored model is written once, under a temporary name, and renamed in, so a file that
        changes is a model replaced or damaged, and is verified again. Only what stays true is remembered (a model
        that verified, or failed its checksums); a file that could not be read for now (permissions, no file
        descriptor) is tried again at the next call, as is a model whose files changed within ``SETTLED_NS`` (a
        change in the same timestamp tick may not show). Reads every stored model the first time: call it off the
        event loop.
        """
        versions = self.versions()
        for gone in set(self._summaries) - set(versions):  # (two listings may run at once, each in a thread)
            self._summaries.pop(gone, None)
        out = []
        for version in versions:
            seen = _identity(self.root / version)
            known = self._summaries.get(version)
            if seen is not None and known is not None and known[0] == seen[0]:
                out.append(known[1])
                continue
            try:
                summary = ModelSummary(version, self.load(version).metrics)
                lasting = True
            except Exception as exc:  # listed as invalid, never served
                summary = ModelSummary(version, {}, str(exc))
                lasting = isinstance(exc, CheckpointError) and not isinstance(exc, ModelUnreadableError)
            if lasting and seen is not None and time.time_ns() - seen[1] >= SETTLED_NS and _identity(self.root / version) == seen:
                self._summaries[version] = (seen[0], summary)
            else:
                self._summaries.pop(version, None)
            out.append(summary)
        return out

    def clean_partial(self) -> list[str]:
        """Remove ``.tmp-*`` directories and ``.ACTIVE.*.tmp`` files left by killed writers; returns their names.

        A directory whose writer (the pid in its name) is another live process is kept:
        that process is saving a model right now (a job while ``--dump-weights`` or
        ``train`` runs beside it). A ``.ACTIVE.*.tmp`` file names no writer: it is removed
        once it is older than :data:`STALE_ACTIVE_TMP_NS`.
        """
        if not self.root.is_dir():
            return []
        gone = []
        now = time.time_ns()
        for p in self.root.iterdir():
            if p.is_dir() and p.name.startswith(".tmp-") and not _writer_alive(p.name):
                shutil.rmtree(p, ignore_errors=True)
                gone.append(p.name)
            elif p.name.startswith(f".{ACTIVE}.") and p.name.endswith(".tmp"):
                with contextlib.suppress(OSError):  # gone meanwhile, or not ours to remove: it is ignored either way
                    if p.is_file() and now - p.stat().st_mtime_ns >= STALE_ACTIVE_TMP_NS:
                        p.unlink()
                        gone.append(p.name)
        return gone

    def save(self, weights: Weights, cfg: Config, metrics: dict[str, Any], version: str | None = None) -> str:
        """Write a model directory atomically; returns its version.

        Raises:
            StorageError: a file cannot be written (full disk, permissions), naming it;
                the partial directory is removed.
        """
        version = version or new_version()
        tmp = self.root / f".tmp-{version}-{os.getpid()}"
        try:
            self._save(tmp, weights, cfg, metrics, version)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise StorageError.from_os_error("cannot store the model: writing failed at", exc.filename or tmp, exc) from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return version

    def _save(self, tmp: Path, weights: Weights, cfg: Config, metrics: dict[str, Any], version: str) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        payloads = {
            "weights.npz": weights_to_bytes(weights),
            "config.json": json.dumps(cfg.neural.model_dump(mode="json"), indent=2, sort_keys=True).encode(),
            "metrics.json": json.dumps(metrics, indent=2, sort_keys=True, default=_json_default).encode(),
        }
        for name, data in payloads.items():
            atomic_write_bytes(tmp / name, data)
        manifest = {"format": MODEL_FORMAT, "version": version, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "files": {name: {"sha256": sha256_bytes(data), "bytes": len(data)} for name, data in payloads.items()}}
        atomic_write_bytes(tmp / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True).encode())
        retrying(os.rename, tmp, self.root / version)
        fsync_dir(self.root)

    def load(self, version: str) -> StoredModel:
        """Verify and load one model (CheckpointError naming the corrupt file)."""
        return load_stored_model(self.root / version)

    def metrics_of(self, version: str) -> dict[str, Any] | None:
        """A stored model's ``metrics.json`` alone (its lineage, its job), unverified and without its weights; None
        when it cannot be read or holds no object."""
        try:
            value = json.loads(read_file(self.root / version / "metrics.json"))
        except (OSError, ValueError, RecursionError):
            return None
        return value if isinstance(value, dict) else None

    def active_version(self) -> str | None:
        """The version named in ``ACTIVE``, if any (None, logged, when the file does not name one)."""
        path = self.root / ACTIVE
        version, problem = read_active(path)
        self.active_problem = None if problem is None else f"{path} {problem}"
        if problem is not None:  # unreadable or damaged: which model was activated is unknown
            log.error("ignoring %s: it %s", path, problem)
        return version

    def set_active(self, version: str) -> None:
        """Name ``version`` the active model (atomic)."""
        atomic_write_bytes(self.root / ACTIVE, (version + "\n").encode())

    def load_for_service(self, cfg: Config, usable: Callable[[StoredModel], object] | None = None) -> StoredModel | None:
        """The model to serve: the active one if valid, else the newest valid one; corrupt ones are refused (logged).

        ``usable``, when given, is called with each verified candidate that fits ``cfg``
        (e.g. to build the engine of it): when it raises, the model counts as unusable like
        a corrupt one (logged with the reason) and the next one is tried.

        Sets :attr:`fallback` to the reason when ``ACTIVE`` names a model that is not the
        one returned (missing, corrupt, unusable, or of another network shape), to
        ``NOT_ACTIVATED`` when there is no ``ACTIVE`` and a stored model is returned, else None.
        Nothing is deleted or rewritten: a refused model directory stays for inspection.

        Raises:
            StorageError: a model file it tries is there but may not be read (permissions): the operator's to fix,
                so no other model is served in its place (see :class:`~cerebellar_norse.errors.ModelUnreadableError`).
            EngineHostError: ``usable`` failed for a host reason (no memory, file descriptor or thread:
                :func:`~cerebellar_norse.errors.host_shortage_reason`): likewise the operator's to fix.
        """
        self.clean_partial()
        self.fallback = None
        self.refused = {}
        order = list(reversed(self.versions()))
        active = self.active_version()
        if active in order:
            order.remove(active)
            order.insert(0, active)
        elif active is not None:
            self.fallback = f"active model {active} (named in models/ACTIVE) does not exist"
        elif self.active_problem is not None:  # the activated model is unknown: the newest valid one is no choice
            self.fallback = f"the active model is unknown: {self.active_problem}"
        for version in order:
            try:
                model = self.load(version)
            except ModelUnreadableError as exc:
                raise exc.storage_error() from None
            except CheckpointError as exc:
                log.error("refusing corrupt model %s: %s", version, exc)
                self.refused[version] = f"corrupt ({exc})"
                if version == active:
                    self.fallback = f"active model {active} is corrupt ({exc})"
                continue
            bad = shape_mismatch(model.neural, cfg.neural)
            if bad:
                log.warning("model %s does not fit this config (%s differ); skipped", version, ", ".join(bad))
                self.refused[version] = f"does not fit this config ({', '.join(bad)} differ)"
                if version == active:
                    self.fallback = f"active model {active} does not fit this config ({', '.join(bad)} differ)"
                continue
            if usable is not None:
                try:
                    usable(model)
                except Exception as exc:  # whatever stops it being served: the next model is tried
                    short = host_shortage_reason(exc)
                    if short is not None:  # the host's to fix, not the model's: serving another would move states aside
                        errno_of = exc.errno if isinstance(exc, OSError) else None
                        raise EngineHostError(version, str(model.path), short, errno_of) from None
                    reason = f"{type(exc).__name__}: {exc}"
                    log.error("refusing model %s: it cannot be served (%s)", version, reason)
                    self.refused[version] = f"cannot be served ({reason})"
                    if version == active:
                        self.fallback = f"active model {active} cannot be served ({reason})"
                    continue
            if active is None and self.fallback is None:
                self.fallback = NOT_ACTIVATED
            return model
        return None


def served_weights(cfg: Config) -> tuple[Weights, str | None]:
    """The weights a service with ``cfg`` would serve and their version: the active (else newest
    valid) stored model, or the seed's untrained network with version None."""
    model = ModelStore(Path(cfg.paths.state_dir)).load_for_service(cfg)
    if model is None:
        return generate_weights(cfg), None
    return model.weights, model.version


def _writer_alive(name: str) -> bool:
    """Whether the pid at the end of a ``.tmp-<version>-<pid>`` name is another running process."""
    text = name.rsplit("-", 1)[-1]
    pid = int(text) if text.isdigit() else 0
    if pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True  # exists, owned by another user
    except (OSError, OverflowError):
        return False
    return True


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def parse_manifest(text: str | bytes, where: str) -> dict[str, Any]:
    """A model manifest: a JSON object whose ``files`` maps each file's name to ``{"bytes", "sha256"}``.

    Raises CheckpointError naming ``where`` when the text is not that (not JSON, nested
    too deeply, or of other types): a manifest is read from disk at every start and from
    uploaded archives, and a wrong one must never get further than this.
    """
    try:
        manifest = json.loads(text)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise CheckpointError(f"unreadable manifest ({type(exc).__name__}: {exc})", where) from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(e, dict) for e in files.values()):
        raise CheckpointError('not a manifest: expected a JSON object with "files": {name: {"bytes": …, "sha256": …}}',
                              where)
    if not isinstance(manifest.get("version", ""), str):
        raise CheckpointError(f"the manifest's version is not a string: {manifest['version']!r}", where)
    fmt = manifest.get("format")
    if fmt is not None and (isinstance(fmt, bool) or not isinstance(fmt, int) or fmt < 1):
        raise CheckpointError(f"the manifest's format {quoted(str(fmt), 40)} is no format number", where)
    if fmt is not None and fmt > MODEL_FORMAT:
        raise CheckpointError(f"written by a newer version of cerebellar-norse (model format {fmt}; this version reads "
                              f"format {MODEL_FORMAT} and older): serve it with that version (or a later one), or "
                              "activate a model this version stored", where)
    return manifest


def _json_object(path: Path, data: bytes | None = None) -> dict[str, Any]:
    """A model file holding one JSON object (CheckpointError naming the file otherwise); ``data``: its bytes, read."""
    try:
        value = json.loads(read_file(path) if data is None else data)
    except (OSError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"unreadable JSON ({type(exc).__name__}: {exc})", str(path)) from None
    if not isinstance(value, dict):
        raise CheckpointError(f"expected a JSON object, found {type(value).__name__}", str(path))
    return value


# The keys of metrics.json that GET /models and the training answers pass on as they are, with their types (None is
# also allowed: a model stored without them).
SERVED_METRICS: tuple[tuple[tuple[str, ...], type, str], ...] = (
    (("validation",), dict, "an object"), (("edge",), str, "a string"), (("test",), dict, "an object"),
    (("test", "verdict"), dict, "an object"))


def served_metrics_problem(metrics: dict[str, Any]) -> str | None:
    """What is wrong with a model's ``metrics.json`` for what the service passes on of it (:data:`SERVED_METRICS`), or
    None: a value of another type would fail every listing of the stored models, not only this model's entry."""
    for keys, kind, what in SERVED_METRICS:
        value: Any = metrics
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None and not isinstance(value, kind):
            return f"{'.'.join(keys)} is {quoted(json.dumps(value), 40)}, expected {what} or null"
    return None


def load_model_dir(path: Path, stored: bool = False) -> StoredModel:
    """Verify the manifest (every file's SHA-256 and size) and load a model directory.

    ``stored``: the directory is a model store's ``models/<version>``, whose manifest must name that version (every
    manifest the store writes does): one naming another, or none, is damaged (CheckpointError naming it). Served under
    another name, the model was one ``models/ACTIVE``, ``POST /models/<version>/activate`` and the market state saved
    with it could not name."""
    path = Path(path)
    mpath = path / MANIFEST
    if not path.is_dir():
        raise CheckpointError("not a model directory", str(path))
    try:
        text = read_file(mpath)
    except OSError as exc:
        if read_refused(exc):  # there, maybe intact, not read (permissions, I/O error, no descriptor): not damage
            raise ModelUnreadableError(str(mpath), exc) from None
        raise CheckpointError(f"missing or unreadable manifest ({exc.strerror or exc})", str(mpath)) from None
    manifest = parse_manifest(text, str(mpath))
    files = manifest["files"]
    blobs: dict[str, bytes] = {}  # each file read once: what is checked is what is loaded
    for name in FILES:
        entry = files.get(name)
        fpath = path / name
        if entry is None:
            raise CheckpointError("not listed in the manifest", str(fpath))
        if not fpath.is_file():
            raise CheckpointError("missing" if not fpath.exists() else "not a regular file (a directory, FIFO, socket "
                                  "or device is there)", str(fpath))
        try:
            blob = read_file(fpath)
        except OSError as exc:
            if read_refused(exc):  # a restore without chown, an I/O error, no descriptor or memory: maybe intact
                raise ModelUnreadableError(str(fpath), exc) from None
            raise CheckpointError(f"cannot read: {exc.strerror or exc}", str(fpath)) from None
        if len(blob) != entry.get("bytes") or sha256_bytes(blob) != entry.get("sha256"):
            raise CheckpointError("checksum mismatch: the file is corrupt or was changed", str(fpath))
        blobs[name] = blob
    weights = weights_from_bytes(blobs["weights.npz"], str(path / "weights.npz"))
    neural, metrics = (_json_object(path / name, blobs[name]) for name in ("config.json", "metrics.json"))
    problem = served_metrics_problem(metrics)
    if problem is not None:
        raise CheckpointError(problem, str(path / "metrics.json"))
    try:
        shape = network_shape(NeuralConfig.model_validate(neural))
    except Exception as exc:
        raise CheckpointError(f"invalid network config: {exc}", str(path / "config.json")) from None
    if weights.shape != shape:
        raise CheckpointError(f"weights of shape {weights.shape} do not match the stored config {shape}", str(path / "weights.npz"))
    version = manifest.get("version", path.name)
    if stored and manifest.get("version") != path.name:
        named = f"names model {quoted(version, 80)}" if "version" in manifest else "names no model version"
        raise CheckpointError(f"the manifest {named}, not {path.name!r}, the directory it is stored in (the manifest "
                              "is damaged, or the directory was renamed): restore the model from a backup, or give the "
                              "directory its version's name", str(mpath))
    try:
        check_version(version)  # served as the model's name: in logs, answers, and each journal file's header
    except InputError:
        raise CheckpointError(f"the manifest's version {quoted(version, 80)} is not a model version (letters, digits, '-', '_',"
                              f" '.'; at most 128; not starting with '.')", str(mpath)) from None
    return StoredModel(version, path, weights, neural, metrics)


def load_stored_model(path: Path) -> StoredModel:
    """:func:`load_model_dir` of a model stored under its version's name (``models/<version>``)."""
    return load_model_dir(path, stored=True)


def split_until(metrics: dict[str, Any]) -> int | None:
    """A model's own ``data.splits.validation_until`` (None when it did not record it)."""
    return _split_time(metrics, "validation_until")


def split_from(metrics: dict[str, Any]) -> int | None:
    """A model's own ``data.splits.train_from`` (None when it did not record it)."""
    return _split_time(metrics, "train_from")


def _split_time(metrics: dict[str, Any], key: str) -> int | None:
    data = metrics.get("data")
    times = data.get("splits") if isinstance(data, dict) else None
    t = times.get(key) if isinstance(times, dict) else None
    return t if isinstance(t, int) and not isinstance(t, bool) else None


GENERATED_DATA = ("bootstrap", "ticks.csv")  # where the first run writes the generated ticks it trains on


def trained_on_generated(metrics: dict[str, Any]) -> bool:
    """Whether a model was trained on generated ticks only (the first run's default model: ``data.generated``, or, for
    models stored before that was recorded, every file being ``<state_dir>/bootstrap/ticks.csv``).

    Their dates are the generator's, not a market's: no real tick of that period was seen, so a model trained from
    it has nothing in sample for it (:func:`seen_until`, :func:`seen_from` pass over it)."""
    data = metrics.get("data")
    if not isinstance(data, dict):
        return False
    if data.get("generated") is True:
        return True
    files = data.get("files")
    return (isinstance(files, list) and bool(files)
            and all(isinstance(f, str) and Path(f).parts[-2:] == GENERATED_DATA for f in files))


def _started_from(m: dict[str, Any]) -> str | None:
    """The model whose weights training started from, if any (``parent_version`` otherwise only names the model
    active at the time of a training from scratch)."""
    started, parent = m.get("started"), m.get("parent_version")
    if not isinstance(parent, str) or (isinstance(started, str) and not started.startswith("from the active model")):
        return None
    return parent


def seen_from(metrics: dict[str, Any], store: ModelStore | None = None) -> int | None:
    """The start of the earliest period a model's weights were fitted on, its ancestors' included (the
    ``data.splits.train_from`` of the model and of each stored model its training started from, as
    :func:`seen_until` follows them, models trained on generated ticks passed over); None when any of them did not
    record it, or an ancestor is no longer stored (then nothing is known to be unseen before its period)."""
    first: int | None = None
    seen: set[str] = set()
    m: dict[str, Any] | None = metrics
    while m is not None:
        if not trained_on_generated(m):
            t = split_from(m)
            if t is None:
                return None
            first = t if first is None else min(first, t)
        parent = _started_from(m)
        if parent is None or parent in seen:
            break
        seen.add(parent)
        m = store.metrics_of(parent) if store is not None and parent in store.versions() else None
        if m is None:
            return None
    return first


def lineage_metrics(metrics: dict[str, Any], store: ModelStore | None = None) -> list[tuple[str | None, dict[str, Any]]]:
    """``(version, metrics.json)`` of a model (version None) and of each stored model its training started from, in
    that order; the chain stops at a model no longer stored (or met before)."""
    out: list[tuple[str | None, dict[str, Any]]] = [(None, metrics)]
    seen: set[str] = set()
    parent = _started_from(metrics)
    while store is not None and parent is not None and parent not in seen and parent in store.versions():
        seen.add(parent)
        pm = store.metrics_of(parent)  # (its metrics only: the weights of every ancestor are not read for this)
        if pm is None:
            break
        out.append((parent, pm))
        parent = _started_from(pm)
    return out


def seen_until(metrics: dict[str, Any], store: ModelStore | None = None) -> tuple[int | None, str | None]:
    """The end of the latest period a model's weights were fitted or chosen on, its ancestors' included: a model
    trained from the active model (``parent_version``) inherits what that one learnt, so its parents' training and
    validation periods are in sample for it too. Returns ``(ms, version)``, the version being the ancestor whose
    period ends latest (None for the model itself), or ``(None, None)`` when nothing was recorded. The bound recorded
    at training time (``lineage.seen_until``) is used, and stored parents are followed for older models. A model
    trained on generated ticks (:func:`trained_on_generated`) saw no real period: its own is passed over, and so is
    a recorded bound that names it."""
    best, who = (None if trained_on_generated(metrics) else split_until(metrics)), None
    lineage = metrics.get("lineage")
    lineage = lineage if isinstance(lineage, dict) else {}
    rec, origin = lineage.get("seen_until"), lineage.get("from")

    def generated(version: object) -> bool:
        pm = (store.metrics_of(version) if store is not None and isinstance(version, str)
              and version in store.versions() else None)
        return pm is not None and trained_on_generated(pm)

    if (isinstance(rec, int) and not isinstance(rec, bool) and (best is None or rec > best)
            and not generated(origin)):
        best, who = rec, origin if isinstance(origin, str) else None

    for parent, pm in lineage_metrics(metrics, store)[1:]:
        until = None if trained_on_generated(pm) else split_until(pm)
        if until is not None and (best is None or until > best):
            best, who = until, parent
    return best, who


def seen_periods(metrics: dict[str, Any], store: ModelStore | None = None) -> list[tuple[int | None, int, str | None]]:
    """The periods a model's weights were fitted or chosen on, one per model of its lineage (itself, then each
    stored model its training started from, as :func:`seen_until` follows them; models trained on generated ticks
    passed over): ``(train_from, validation_until, version)``, ``train_from`` None where a model did not record it
    (every tick up to its end is counted) and ``version`` None for the model itself. Ticks between two such periods
    were seen by none of them. A bound recorded at training time (``lineage.seen_until``) that no stored model's
    period reaches (its model is no longer stored) is a period with no known start."""
    out: list[tuple[int | None, int, str | None]] = []
    for version, m in lineage_metrics(metrics, store):
        until = None if trained_on_generated(m) else split_until(m)
        if until is not None:
            out.append((split_from(m), until, version))
    rec, who = seen_until(metrics, store)
    if rec is not None and all(until < rec for _, until, _ in out):
        out.append((None, rec, who))
    return out


def _verify_job_records(jobs: Path, ok: list[str], problems: list[str]) -> None:
    """Check each job record's checksum (records written before checksums have none and are taken as they are)."""
    n = 0
    for path in sorted(jobs.glob("*.json")):
        try:
            load_checksummed_json(read_file(path), str(path))
            n += 1
        except CheckpointError as exc:
            problems.append(f"{exc}: the service ignores this job record at start (WARNING), so that job's history "
                            "is lost; delete the file")
        except OSError as exc:
            problems.append(f"{StorageError.from_os_error('cannot read job record', path, exc)}: the service ignores "
                            "it at start (WARNING); make it readable by the service's user, or delete it")
    if n:
        ok.append(f"{jobs}: {n} job {'record' if n == 1 else 'records'} OK")


def verify_tree(root: Path) -> tuple[list[str], list[str]]:
    """Verify every model directory and state file under ``root``; returns (ok, problems) lines."""
    from ..engine.persistence import STATE_FILE, check_state_rows, read_state_payload
    from ..engine.state_dir import read_state_id
    from ..storage import read_checksummed, read_state_file, unseal

    ok: list[str] = []
    problems: list[str] = []
    root = Path(root)
    if not root.exists():
        return ok, [f"{root}: does not exist"]
    unreadable: list[OSError] = []  # directories the walks below pass over in silence (permissions)
    for _ in os.walk(root, onerror=unreadable.append):
        pass
    for exc in unreadable:
        problems.append(f"{StorageError.from_os_error('cannot read', exc.filename or root, exc)}: nothing in it was "
                        "verified; make it readable (by the service's user too) and verify again")
    stored: dict[Path, set[str]] = {}  # a models dir -> the versions in it that load
    for mpath in sorted(root.rglob(MANIFEST)):
        if any(part.startswith(".tmp-") for part in mpath.parts):
            continue
        try:
            m = (load_stored_model if mpath.parent.parent.name == MODELS_DIR else load_model_dir)(mpath.parent)
            ok.append(f"{mpath.parent}: model {m.version} OK")
            stored.setdefault(mpath.parent.parent, set()).add(m.version)
        except ModelUnreadableError as exc:  # what the start refuses, in the same words
            problems.append(str(exc.storage_error()))
        except CheckpointError as exc:
            problems.append(str(exc))
    no_models: set[Path] = set()  # state dirs whose models dir is unusable: named here, the start refuses them
    for sdir in sorted({root, *(p.parent for p in _named_under(root, STATE_FILE))}):
        problem = models_dir_problem(sdir)
        if problem is not None:
            problems.append(problem)
            no_models.add(sdir)
        jobs = sdir / "jobs"
        if (jobs.exists() or jobs.is_symlink()) and not jobs.is_dir():
            problems.append(f"{jobs}: not a directory (the job records' directory goes there): the service moves it "
                            "aside at start (WARNING); no job record could be written while it stands")
        elif jobs.is_dir():
            _verify_job_records(jobs, ok, problems)
    for apath in _named_under(root, ACTIVE):
        if apath.parent.name == MODELS_DIR:
            problem = _active_problem(apath)
            if problem is not None:
                problems.append(f"{apath}: {problem}: the service would serve the newest valid model instead "
                                f"(/health degraded)")
    # the journals first: a checkpoint a running service writes meanwhile only covers more of them (read after them,
    # it is never older than the journal files seen)
    journals = _verify_journals(root, ok, problems)
    for spath in _named_under(root, STATE_FILE):
        if spath.is_symlink() and not spath.exists():  # Path.rglob and exists() pass over a dangling link
            problems.append(f"{spath}: {_broken_link(spath)}: no market state can be read from it (the service moves "
                            f"it aside at start and every market starts from rest); point it at the state file, or "
                            f"remove it")
            continue
        try:  # read as the start reads it: a read refused for no fault of its bytes stops the start, moving nothing
            data = read_state_file(spath, "the market state")
            payload = read_checksummed(spath) if data is None else unseal(data, str(spath))
        except StorageError as exc:
            problems.append(f"{exc}: the service does not start on it (nothing is moved aside): make it readable by "
                            "the service's user (e.g. chown) and start again")
            continue
        except CheckpointError as exc:
            problems.append(str(exc))
            continue
        try:  # what the start checks without the network's config (the fingerprint needs it)
            state = read_state_payload(payload, str(spath))
            check_state_rows(state, str(spath))
        except CheckpointError as exc:
            problems.append(f"{exc}: the service moves it aside at start and every market starts from rest")
            continue
        except NewerFormatError as exc:  # the start refuses it, moving nothing: the message says so
            problems.append(str(exc))
            continue
        saved_with = state.fingerprint.get("model_version") if isinstance(state.fingerprint, dict) else None
        models = ModelStore(spath.parent).root
        if (isinstance(saved_with, str) and not saved_with.startswith("seed-")
                and not _model_stored(models, saved_with, stored) and spath.parent not in no_models):
            problems.append(f"{spath}: saved with model {saved_with}, which is not stored in {models} (or is not "
                            f"usable, above): the service moves it aside at start, every market starts from rest and "
                            f"/health says degraded; restore models/{saved_with} from a backup")
            continue
        n, found = len(state.markets), len(problems)
        if spath.parent in journals:
            _verify_journal_chain(spath, state, *journals[spath.parent], problems)
        else:  # no journal: the checkpoint's state id is still compared with the dir's, as at start
            with contextlib.suppress(CerebellarNorseError):  # a damaged or unreadable state-id: named above
                _verify_journal_chain(spath, state, read_state_id(spath.parent), [], problems)
        if len(problems) == found or not problems[-1].startswith(f"{spath}:"):
            ok.append(f"{spath}: market state OK ({n} {'market' if n == 1 else 'markets'})")
    return ok, problems


JournalPart = tuple[Path, int, int]  # a journal file, its base and its last record's journal position


def _verify_journals(root: Path, ok: list[str], problems: list[str]) -> dict[Path, tuple[str | None, list[JournalPart]]]:
    """Every state dir identity (``state-id``) and tick journal (``journal/*.journal``) under ``root``, read as the
    service reads them at start: a damaged one is moved aside there (and the acknowledged ticks it holds are lost), so
    it is a problem here too. Returns, per state dir with a journal, its identity and its readable journal files (for
    :func:`_verify_journal_chain`)."""
    from ..engine.persistence import STATE_FILE
    from ..engine.segments import JOURNAL_DIR, SegmentReader, batch_size_for_record, list_segments, misplaced_entries
    from ..engine.state_dir import STATE_ID_FILE, read_state_id

    ids: dict[Path, str | None] = {}
    for ipath in _named_under(root, STATE_ID_FILE):
        try:
            ids[ipath.parent] = read_state_id(ipath.parent)
            ok.append(f"{ipath}: state dir identity OK")
        except CheckpointError as exc:
            problems.append(f"{exc}: the service moves it aside at start (ERROR) and takes the checkpoint's identity")
        except StorageError as exc:  # intact but not ours to read: the start refuses it, moving nothing
            problems.append(f"{exc}: the service does not start on it (nothing is moved aside): make it readable by "
                            "the service's user (e.g. chown) and start again")
    journals: dict[Path, tuple[str | None, list[JournalPart]]] = {}
    for jdir in _named_under(root, JOURNAL_DIR):
        state_dir = (jdir.parent / STATE_ID_FILE).exists() or (jdir.parent / STATE_FILE).exists()
        if jdir.is_dir() or state_dir:  # a file called journal elsewhere is not the service's
            for path, what in misplaced_entries(jdir):
                problems.append(f"{path}: {what}: the service moves it aside at start")
        segments = list_segments(jdir)
        dir_id = ids.get(jdir.parent)
        chain: list[JournalPart] = []  # this dir's readable segments, in order
        for base, path in segments:
            try:
                reader = SegmentReader(path, last=path == segments[-1][1])
                n = sum(1 for _ in reader.records())
            except FileNotFoundError:  # a running service's checkpoint covered it and deleted it meanwhile
                continue
            except OSError as exc:
                if read_refused(exc):  # maybe intact: the start refuses it, moving nothing
                    problems.append(f"{path}: cannot read: {exc.strerror or exc}: the service does not start on it "
                                    f"(nothing is moved aside)")
                else:
                    problems.append(f"{path}: {exc.strerror or exc}: the service moves it aside at start and its ticks "
                                    f"are lost")
                continue
            except ValueError as exc:
                problems.append(f"{path}: {getattr(exc, 'strerror', None) or exc}: the service moves it aside at start "
                                f"and its ticks are lost")
                continue
            except NewerFormatError as exc:  # the start refuses it, moving nothing: the message says so
                problems.append(str(exc))
                continue
            if reader.state_id is not None and dir_id is not None and reader.state_id != dir_id:
                problems.append(f"{path}: written by another state dir (its state id is {reader.state_id}; "
                                f"{jdir.parent / STATE_ID_FILE} says {dir_id}): the service moves it aside at start")
                continue
            if reader.damage is not None:
                problems.append(f"{path}: {reader.damage}: the service applies the records before the damage and moves "
                                f"the file aside at start (the ticks after it are lost)")
            else:
                cut = f"; an unfinished last record ({reader.unfinished} bytes) is dropped" if reader.unfinished else ""
                if reader.cut_by_bound and not reader.bound_recorded:  # written before headers recorded the bound
                    k = batch_size_for_record(reader.unfinished)
                    cut += (f" where performance.batch_size is {k} or more (the file does not record its writer's"
                            " largest record; with a smaller batch_size the service moves it aside at start)")
                ok.append(f"{path}: journal OK ({n} records from {base + 1}{cut})")
            chain.append((path, reader.base, reader.last_seq if reader.last_seq is not None else reader.base))
        journals[jdir.parent] = (dir_id, chain)
    return journals


def _verify_journal_chain(spath: Path, state: StateFile, dir_id: str | None, chain: list[JournalPart],
                          problems: list[str]) -> None:
    """What the service's start would make of a checkpoint (``spath``, its verified contents ``state``) and its state dir's
    journal together: a checkpoint of another state dir (moved aside, and the journal with it), or a journal that
    does not continue the checkpoint (records missing between them: the journal is moved aside and its acknowledged
    ticks lost)."""
    state_dir = spath.parent
    seq, ckpt_id = state.journal_seq, state.state_id
    if ckpt_id is not None and dir_id is not None and ckpt_id != dir_id:
        lost = f"; this dir's journal ({', '.join(p.name for p, _, _ in chain)}) cannot be applied then" if chain else ""
        problems.append(f"{spath}: written by another state dir (its state id is {ckpt_id}; "
                        f"{state_dir / 'state-id'} says {dir_id}): the service moves it aside at start and every "
                        f"market starts from rest{lost}; put this dir's own market_state.bin back (from a backup)")
        return
    for path, base, last in chain:
        if base > seq:
            problems.append(f"{path}: records {seq + 1} to {base} are missing between {spath.name} (journal position "
                            f"{seq}) and this file: the service moves it (and any later journal file) aside at start "
                            f"and its ticks are lost")
            return
        seq = max(seq, last)


def _named_under(root: Path, name: str) -> list[Path]:
    """Every entry called ``name`` under ``root`` (directories of links not followed), dangling links included."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        if name in filenames or name in dirnames:
            found.append(Path(dirpath) / name)
    return sorted(found)


def _model_stored(models: Path, version: str, stored: dict[Path, set[str]]) -> bool:
    """Whether model ``version`` loads from the ``models`` dir: among those verified (``stored``, by models dir), or
    loaded from it now (a models dir, or a version dir, that is a symbolic link: ``rglob`` does not walk into it)."""
    if version in stored.get(models, set()):
        return True
    try:
        load_stored_model(models / version)
    except ModelUnreadableError:  # stored, not readable: named above, and the start refuses it rather than move aside
        return True
    except CheckpointError:
        return False
    return True


def read_active(path: Path) -> tuple[str | None, str | None]:
    """``(version, problem)`` of a ``models/ACTIVE`` file: the version it names (None for no file or an empty one), or
    what is wrong with it (``cannot be read (…)``, ``does not name a model version``)."""
    try:
        version = read_file(path).decode("utf-8").strip()
        if version:
            check_version(version)
    except FileNotFoundError:
        return None, None
    except OSError as exc:  # a directory, no permission
        return None, f"cannot be read ({exc.strerror or exc})"
    except (ValueError, InputError):  # not UTF-8, not a version
        return None, "does not name a model version"
    return version or None, None


def _active_problem(path: Path) -> str | None:
    """What is wrong with a ``models/ACTIVE`` file (as the service reads it), or None when it names a stored model."""
    if path.is_symlink() and not path.exists():
        return _broken_link(path)
    version, problem = read_active(path)
    if problem is None and version is not None and not (path.parent / version / MANIFEST).is_file():
        problem = f"names model {version}, which is not stored beside it"
    return problem


def models_dir_problem(state_dir: Path) -> str | None:
    """What makes ``<state_dir>/models`` unusable while it is there: a symbolic link to nothing (dangling, or a loop:
    a shared models directory not mounted, say) or something other than a directory; None when it is a directory or
    absent (a new state dir). The service refuses to start on it rather than serve without its models and move the
    market states saved with them aside; ``--verify-data`` names it."""
    root = Path(state_dir) / MODELS_DIR
    if root.is_symlink() and not root.exists():
        what = _broken_link(root)
    elif root.exists() and not root.is_dir():
        what = "not a directory"
    else:
        return None
    return (f"{root}: {what}: the stored models cannot be read (the service does not start on it, rather than serve "
            "without them and move aside the market states saved with them); restore it (mount or create its target), "
            "or remove it to start without models")


def _broken_link(path: Path) -> str:
    """What is wrong with a symbolic link that leads to no file."""
    try:
        target = os.readlink(path)
    except OSError as exc:
        return f"an unreadable symbolic link ({exc.strerror or exc})"
    try:
        path.stat()
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"a symbolic link to {target!r} that loops"
    return f"a dangling symbolic link: its target {target!r} does not exist"
