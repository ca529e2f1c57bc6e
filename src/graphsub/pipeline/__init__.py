"""graphsub's main job as named stages over one shared state (`Run`) and one time budget
(graphsub.budget), with one `Settings` object read by every stage.

| stage | module | what it does |
|---|---|---|
| probe | `probe_stage` | the original run once; other sizes or input values where it fails |
| peers | `export_stages` | other tools' optimizers (onnxruntime, onnxscript, onnxslim) as candidates |
| search | `search_stages` | the search the settings name (optionally within MetaFlow's split) |
| fission | `search_stages` | fission and Korch's kernel orchestration of the best graph |
| export | `export_stages` | candidates written as ONNX |
| ort-fusions | `export_stages` | onnxruntime's fused operators, where asked |
| measure | `measure_stages` | candidates timed and confirmed on the target (graphsub.selection) |
| verify | `measure_stages` | the chosen candidate checked against the original |
| report | `report_stage` | the OptimizeReport |

`optimize_model` runs `model_stages(settings)`, `optimize` the search alone, the torch.compile backend
the search and fission of each captured part and its own race (graphsub.frontends), the
fuzzer each stage it checks; all through `run_stages`.
"""

from __future__ import annotations

from graphsub.pipeline.export_stages import EXPORT, ORT_FUSIONS, PEERS
from graphsub.pipeline.measure_stages import MEASURE, VERIFY, VerificationError
from graphsub.pipeline.objective import Objective
from graphsub.pipeline.probe_stage import PROBE
from graphsub.pipeline.report_stage import REPORT
from graphsub.pipeline.run import Run, Stage, load_rule_files, run_stages, start_run
from graphsub.pipeline.search_stages import FISSION, SEARCH, ProgressRecorder
from graphsub.pipeline.settings import Settings, parse_option


def model_stages(settings: Settings) -> tuple[Stage, ...]:
    """The main job's stages, in order, for these settings."""
    return (PROBE, *((PEERS,) if settings.peers else ()), SEARCH,
            *((FISSION,) if settings.fission else ()), EXPORT,
            *((ORT_FUSIONS,) if settings.ort_fusions else ()), MEASURE, VERIFY, REPORT)


__all__ = ["EXPORT", "FISSION", "MEASURE", "model_stages", "ORT_FUSIONS", "Objective", "PEERS",
           "PROBE", "ProgressRecorder", "REPORT", "Run", "SEARCH", "Settings", "Stage", "VERIFY",
           "VerificationError", "load_rule_files", "parse_option", "run_stages", "start_run"]
