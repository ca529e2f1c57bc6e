"""Equality saturation over graphsub's IR: the e-graph, e-matching with single- and
multi-pattern rules, cycle filtering, extraction and MCTS-guided construction (Tensat; the
MCTS paper, PACT'24). The searches are `eqsat_search` and `mcts_search`
(`graphsub optimize --algorithm eqsat|mcts`), registered by name in graphsub.search's
registry, which imports their modules on its first lookup."""
