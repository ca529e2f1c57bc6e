"""graphsub's main job, stage by stage: what each stage makes handed to those that need it.

This function is the order the stages depend on, written out: the probe may change the
context (where the model runs), the peers' outputs go to the search (to continue from) and
to the export (as candidates), the search's result to fission and the export, the exported
candidates to the measuring and the verification, and all of it to the report.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphsub.pipeline.export_stages import EXPORT, ORT_FUSIONS
from graphsub.pipeline.fission_stage import FISSION
from graphsub.pipeline.measure_stage import MEASURE
from graphsub.pipeline.verify_stage import VERIFY
from graphsub.pipeline.probe_stage import PROBE
from graphsub.pipeline.report_stage import REPORT
from graphsub.pipeline.run import RunContext, run_stage
from graphsub.pipeline.peers_stage import PEERS
from graphsub.pipeline.search_stage import SEARCH
from graphsub.report.optimize import OptimizeReport
from graphsub.runtime.ort_sessions import ModelData


@dataclass(frozen=True)
class ModelOutcome:
    """What the main job makes: the ONNX to write (the original's where nothing beats it)
    and the report of how it was chosen."""

    model: ModelData
    report: OptimizeReport


def optimize_stages(context: RunContext) -> ModelOutcome:
    """The main job's stages on `context`, each on its clock, in the order their inputs
    are made; the settings choose the optional ones (peers, fission, onnxruntime's
    fusions)."""
    settings = context.settings
    try:
        context = run_stage(context, PROBE)
        peers = run_stage(context, PEERS) if settings.peers else ()
        found = run_stage(context, SEARCH, peers)
        if settings.fission:
            found = run_stage(context, FISSION, found)
        exported = run_stage(context, EXPORT, found, peers)
        if settings.ort_fusions:
            exported = run_stage(context, ORT_FUSIONS, found, exported)
        selection = run_stage(context, MEASURE, exported)
        verified = run_stage(context, VERIFY, exported, selection)
    finally:
        context.sessions.close()  # the report needs no session
    report = run_stage(context, REPORT, found, exported, verified)
    return ModelOutcome(verified.model, report)


__all__ = ["ModelOutcome", "optimize_stages"]
