"""Why the served model is degraded: the facts, and the one function that words them.

``GET /health`` answers ``"degraded"`` (200) while the service serves something nobody
chose, or something that carries no information: a fallback because the active model
cannot be served (or none was ever activated), the untrained network of the configured
seed, or a model whose market states were lost at restore. The service keeps those
facts (:class:`Degradation`); ``/health``'s reason, the ``systemctl status`` line and the
``cerebellar_norse_degraded`` metric all read them, and :func:`reason` writes the text
once, naming the models stored by the time it is asked.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Degradation:
    """What is wrong with the model ``model_version`` while it is served.

    Applies only while that version is served: activating another model clears it.
    """

    model_version: str
    fallback: str | None = None  # why the active model is not served, the fallback being model_version
    untrained_seed: int | None = None  # the untrained network of this seed is served (no trained model usable)
    restore_problem: str | None = None  # market states lost or reset at restore (until the next restart)
    refused: tuple[str, ...] = ()  # stored versions refused at start (corrupt, of another network, unusable)

    def with_restore_problem(self, problem: str) -> Degradation:
        """The same facts, and a problem found when the market states were restored."""
        return replace(self, restore_problem=problem)


def untrained_reason(seed: int, version: str, stored: list[str], refused: tuple[str, ...] = ()) -> str:
    """Why serving the untrained network of ``seed`` (``version``) is degraded, given the ``stored`` model versions
    (oldest first) and those of them ``refused`` at start (corrupt, of another network, unusable): none stored;
    stored but none activated (a job with activation off, an upload); or every stored one refused (a corrupt active
    model, or models of the old size after a change of ``[neural]``), which neither activating them nor a restart
    would serve."""
    head = f"serving the untrained network of seed {seed} ({version}), whose signals carry no information"
    if not stored:
        return (f"no trained model is stored: {head}; train one (cerebellar-norse train, POST /training) or store and "
                "activate one (PUT /models/<version>, POST /models/<version>/activate)")
    usable = [v for v in stored if v not in refused]
    gone = [v for v in stored if v in refused]
    if not usable:
        n = len(gone)
        return (f"no stored model can be served: {head}; {n} trained model{'s are' if n > 1 else ' is'} stored "
                f"(newest {gone[-1]}) but {'each was' if n > 1 else 'it was'} refused at start (corrupt or not of "
                "this network: see the log, cerebellar-norse --validate-model): train one for this network "
                "(cerebellar-norse train, POST /training) or store and activate one that fits "
                "(PUT /models/<version>, POST /models/<version>/activate)")
    count = f"{len(usable)} trained model{'s are' if len(usable) > 1 else ' is'} stored (newest {usable[-1]})"
    more = f" ({len(gone)} more refused at start: corrupt or not of this network)" if gone else ""
    return (f"no trained model is activated: {head}; {count}, none activated{more}: activate one "
            "(POST /models/<version>/activate); a restart would serve the newest")


def reason(d: Degradation, stored: list[str]) -> str:
    """The reason ``/health`` gives: every fact that applies, in the order fallback, untrained network, restore
    problem, joined by ``"; "``. ``stored`` is the model versions stored now (oldest first)."""
    parts = []
    if d.fallback is not None:
        parts.append(f"{d.fallback}; serving model {d.model_version} instead")
    if d.untrained_seed is not None:
        parts.append(untrained_reason(d.untrained_seed, d.model_version, stored, d.refused))
    if d.restore_problem is not None:
        parts.append(d.restore_problem)
    return "; ".join(parts)
