"""The ONNX operator test corpus through graphsub (issue 51): every operator at every opset
the onnx package tests it at, with the inputs and expected outputs its authors wrote
(graphsub.fuzz.corpus). No case may end in a traceback or a wrong output; a refusal is one
line naming what graphsub does not take. The corpus is run in CHUNKS so that the test
workers share it."""

from __future__ import annotations

import warnings
from functools import lru_cache

import pytest

from graphsub.fuzz.corpus import check_case, node_cases

CHUNKS = 8


@lru_cache(maxsize=1)
def corpus():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators' own numpy warnings
        return node_cases()


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_no_case_of_the_operator_corpus_is_a_traceback_or_a_wrong_output(chunk):
    findings = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case in corpus()[chunk::CHUNKS]:
            outcome = check_case(case, search_seconds=0.2)
            for path, status in outcome.statuses.items():
                if status in ("traceback", "wrong"):
                    findings.append(f"{case.name} {path}: {outcome.messages.get(path, '')[:300]}")
                elif status == "refused":
                    message = outcome.messages[path]
                    if "\n" in message.strip() or not message:
                        findings.append(f"{case.name} {path}: a refusal of more than one line")
    assert not findings, "\n".join(findings)


def test_the_corpus_holds_every_kind_of_value_and_old_and_new_opsets():
    names = {case.name for case in corpus()}
    opsets = {o.version for case in corpus() for o in case.model.opset_import
              if o.domain in ("", "ai.onnx")}
    assert len(names) > 1500
    assert any("sequence" in n for n in names) and any("optional" in n for n in names)
    assert any("string" in n for n in names)
    assert min(opsets) <= 7 and max(opsets) >= 24
