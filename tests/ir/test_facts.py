"""A graph's facts: a typed, frozen record that every graph made from it carries, and that a
stage changes only by making a new graph."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import graphsub
from graphsub.ir import GraphBuilder
from graphsub.ir.binding import bind_graph
from graphsub.ir.facts import NO_FACTS, GraphFacts
from graphsub.rules import parse_rules
from graphsub import optimize
from graphsub.tensors.symbolic import SymbolRange, size_symbol

GIVEN = {"rate": np.array([16000], dtype=np.int64)}


def graph_with_facts():
    b = GraphBuilder(seed=3)
    x = b.input("x", (2, 4))
    rate = b.input("rate", (1,), "int64")
    y = b.relu(b.relu(x))
    b.output(y, "y")
    b.output(b.cast(rate, to="float32"), "r")
    return b.build(GraphFacts(opset=17, input_values=GIVEN, inputs_as_declared=True))


def test_facts_are_frozen_and_changed_only_in_a_new_graph():
    graph = graph_with_facts()
    with pytest.raises(dataclasses.FrozenInstanceError):
        graph.facts.opset = 18  # type: ignore[misc]
    other = graph.with_facts(inputs_as_declared=False)
    assert graph.facts.inputs_as_declared and not other.facts.inputs_as_declared
    assert other.facts.opset == 17 and other.facts.input_values is GIVEN
    assert other.structural_hash() == graph.structural_hash()  # not part of the computation
    assert GraphBuilder().build.__defaults__ == (NO_FACTS,)


def test_an_edit_a_search_and_a_part_carry_the_facts():
    graph = graph_with_facts()
    rules = parse_rules("rule relu-twice:\n  (relu (relu ?x)) => (relu ?x)\n")
    found = optimize(graph, rules, "greedy", rules_only=True, cost="analytic", time_limit=5)
    assert len(found.graph) < len(graph)  # the rewrite applied
    assert found.graph.facts == graph.facts
    data = graphsub.to_onnx(found.graph).SerializeToString()
    assert graphsub.load(data).facts.opset == 17


def test_binding_sizes_drops_the_symbols_and_keeps_the_rest():
    batch = size_symbol("batch")
    b = GraphBuilder()
    x = b.input("x", (batch, 4))
    b.output(b.relu(x), "y")
    graph = b.build(GraphFacts(opset=17, symbols={"batch": SymbolRange()},
                               output_dims={"y": ("batch", 4)}))
    bound = bind_graph(graph, {"batch": 3})
    assert bound.facts.symbols == {} and bound.facts.output_dims == {}
    assert bound.facts.opset == 17
