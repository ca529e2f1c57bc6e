"""The stage that runs the original model once before the search, at the inputs graphsub
makes up, and finds others where those fail (graphsub.runtime.probe): a model that runs only
at some sizes or input values is then searched, measured and verified there, instead of
failing after its whole search, or it fails at once with what to give."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from graphsub.budget import StageClock
from graphsub.errors import GraphsubError
from graphsub.pipeline.run import RunContext, Stage
from graphsub.runtime.check_sizes import ProfileShape
from graphsub.runtime.probe import fixed_declaration_error, probe

#: The most seconds the probe takes, and its share of a shorter time limit.
PROBE_MAX_SECONDS = 20.0
PROBE_SHARE = 0.1


def probe_inputs(context: RunContext, clock: StageClock) -> RunContext:
    """The context the later stages run in: the given one, or, where the original fails on
    made-up inputs, one with the sizes and input values where it runs. The original is run
    where it may fail: a model with open sizes at the default profile, or with integer
    scalar inputs (a mode, a sample rate) not given values. Where it fails there and runs
    elsewhere, the run goes on there, with a note; where it runs nowhere tried, the run ends
    now with the error and what to give. A large model (RunContext.large) is not probed: a
    session of it costs seconds and a copy of its weights, and the measuring stage runs it
    anyway."""
    run = _declared_as_original_where_needed(context)
    graph = run.graph
    symbols = graph.facts.symbols
    given = graph.facts.input_values
    scalars = [graph[i].attrs["name"] for i in graph.inputs
               if graph[i].type.dtype.startswith(("int", "uint")) and graph[i].type.is_static
               and graph[i].type.numel == 1 and graph[i].attrs["name"] not in given]
    if run.original is None or run.large or not (symbols or scalars):
        return run
    default = not run.settings.shape_profile
    base = max(run.profile, key=lambda shape: shape.weight).values if run.profile else {}
    seconds = min(PROBE_MAX_SECONDS, max(2.0, PROBE_SHARE * run.settings.time_limit))
    found = probe(graph, run.original, base, bool(symbols) and default, seconds,
                  lambda: run.sessions.reference(run.original_model, run.threads, run.target))
    if found is None or (found.runs and found.tried == 1):
        return run
    if not found.runs:
        raise GraphsubError(_cannot_run(run, base, found.error, found.tried, scalars))
    changed = []
    if found.binding != base:
        profile = (ProfileShape.of(found.binding),)
        run = replace(run, profile=profile, time_model=run.time_model.at_profile(profile))
        changed.append(", ".join(f"{k}={v}" for k, v in sorted(found.binding.items())))
    if found.values:
        run = replace(run, graph=graph.with_facts(input_values={**given, **found.values}))
        changed.append(", ".join(f"{k}={np.asarray(v).reshape(-1)[0]}"
                                 for k, v in sorted(found.values.items())))
    note = (f"the original model fails on graphsub's default inputs ({found.error}); it runs "
            f"at {'; '.join(changed)}, which graphsub searched, measured and verified at "
            "(give --input-shape, --shape-profile or --input-value to choose others)")
    run.say(f"the original runs at {'; '.join(changed)}, not at the default inputs")
    run.log.note(note)
    return run


#: Operators whose bodies onnxruntime types from the declared sizes of the model's inputs.
_CONTROL_FLOW = {"If", "Loop", "Scan"}


def _declared_as_original_where_needed(run: RunContext) -> RunContext:
    """Where the user fixed open sizes (--input-shape) of a model with control flow that
    onnxruntime cannot build when those sizes are declared (while it builds the original),
    candidates are written with the inputs declared as the original declared them; they are
    still searched, measured and verified at the fixed sizes."""
    graph = run.graph
    fixed = graph.facts.input_dims
    opened = any(not isinstance(d, int) for dims in fixed.values() if dims for d in dims)
    if run.original is None or run.large or not opened or not any(
            n.op == "opaque" and n.attrs["op_type"] in _CONTROL_FLOW
            for n in graph.nodes.values()):
        return run
    error = fixed_declaration_error(graph, run.original)
    if not error:
        return run
    run.log.note(f"onnxruntime cannot build this model with the sizes given declared on "
                 f"its inputs ({error}): the written model declares its inputs as the "
                 "original did, and is checked at the sizes given only; run it at those")
    return replace(run, graph=graph.with_facts(inputs_as_declared=True))


def _cannot_run(run: RunContext, base: dict[str, int], error: str, tried: int,
                scalars: list[str]) -> str:
    """The error of a model that ran at none of the inputs tried, with what to give."""
    graph = run.graph
    examples = []
    for i in graph.inputs:
        t = graph[i].type
        if not t.is_static:
            bound = t.bound(base).shape
            examples.append(f"--input-shape {graph[i].attrs['name']}="
                            f"{'x'.join(str(d) for d in bound)}")
    hints = []
    if examples:
        hints.append("the sizes it runs at with " + " ".join(examples[:2])
                     + " (your sizes in place of these) or --shape-profile")
    if scalars:
        hints.append("the values of its integer inputs with "
                     + " ".join(f"--input-value {name}=VALUE" for name in scalars))
    at = (", ".join(f"{k}={v}" for k, v in sorted(base.items())) or "its sizes")
    return (f"onnxruntime cannot run the original model on the inputs graphsub makes up "
            f"({error}); it was run at {at} and {tried - 1} other combination(s) of sizes "
            f"and input values, and failed at each. Give {' and '.join(hints)}")


PROBE = Stage("probe", probe_inputs)

__all__ = ["PROBE"]
