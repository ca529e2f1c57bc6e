"""graphsub's main job as named stages that take values and return values, over one
context (`RunContext`: the settings, the model, the target, the cost model) and one time
budget (graphsub.budget).

| stage | module | takes | makes |
|---|---|---|---|
| probe | `probe_stage` | | the context where the original runs (sizes, input values) |
| peers | `peers_stage` | | other tools' optimizers' outputs (onnxruntime, onnxscript, onnxslim) |
| search | `search_stage` | peers | `Found`: the search's candidates (optionally in MetaFlow's split) |
| fission | `fission_stage` | found | found, with fission and Korch's orchestration of its best |
| export | `export_stages` | found, peers | the candidates written as ONNX |
| ort-fusions | `export_stages` | found, exported | those and onnxruntime's fused operators |
| measure | `measure_stage` | exported | the `Selection`: candidates timed on the target |
| verify | `verify_stage` | exported, selection | `Verified`: the model to write, checked |
| report | `report_stage` | found, exported, verified | the OptimizeReport |

What they hand each other (`Exported`, `Found`) is in `values`; the rules a run reads (the
library, with the user's added or alone) in `rule_sets`.

`optimize_model` runs them through `optimize_stages` (graphsub.pipeline.model), `optimize`
the search alone, the torch.compile backend the search and fission of each captured part and
its own race (graphsub.frontends), the fuzzer each stage it checks; all through `run_stage`.
"""

from __future__ import annotations

from graphsub.pipeline.export_stages import EXPORT, ORT_FUSIONS
from graphsub.pipeline.fission_stage import FISSION
from graphsub.pipeline.measure_stage import MEASURE
from graphsub.pipeline.verify_stage import VERIFY, VerificationError, Verified
from graphsub.pipeline.model import ModelOutcome, optimize_stages
from graphsub.pipeline.objective import Objective
from graphsub.pipeline.probe_stage import PROBE
from graphsub.pipeline.report_stage import REPORT
from graphsub.pipeline.rule_sets import RuleSet, load_rule_files, rule_set
from graphsub.pipeline.run import RunContext, Stage, run_stage, start_run
from graphsub.pipeline.peers_stage import PEERS
from graphsub.pipeline.search_stage import SEARCH, ProgressRecorder
from graphsub.pipeline.settings import Settings, parse_option
from graphsub.pipeline.values import Exported, Found

__all__ = ["EXPORT", "Exported", "FISSION", "Found", "MEASURE", "ModelOutcome", "ORT_FUSIONS",
           "Objective", "PEERS", "PROBE", "ProgressRecorder", "REPORT", "RuleSet", "RunContext",
           "SEARCH", "Settings", "Stage", "VERIFY", "VerificationError", "Verified",
           "load_rule_files", "optimize_stages", "parse_option", "rule_set", "run_stage",
           "start_run"]
