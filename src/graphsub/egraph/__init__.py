"""Equality saturation over graphsub's IR: the e-graph, e-matching with single- and
multi-pattern rules, cycle filtering, extraction and MCTS-guided construction (Tensat; the
MCTS paper, PACT'24). The searches are `eqsat_search` and `mcts_search`
(`graphsub optimize --algorithm eqsat|mcts`)."""

from graphsub.egraph import mcts, saturation  # noqa: F401  (register eqsat and mcts by name)
