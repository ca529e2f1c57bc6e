import os

from hypothesis import HealthCheck, settings

# onnxruntime session start-up makes example timings noisy, so no per-example deadline; CI
# runs derandomized so a red build is always reproducible.
settings.register_profile("default", deadline=None, max_examples=60,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", parent=settings.get_profile("default"), derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")


import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def rules_checked_once(tmp_path_factory):
    """Check the built-in and fission rules once per test process, before any test: on a
    fresh cache that takes 15-40 s, which would otherwise fall inside the time limit of
    whichever test happened to load them first (its run then has no time left to measure)."""
    from graphsub.fission import stage as fission_stage
    from graphsub.rules import builtin_rules

    previous = os.environ.get("GRAPHSUB_CACHE_DIR")
    os.environ["GRAPHSUB_CACHE_DIR"] = str(tmp_path_factory.mktemp("rules-cache"))
    try:
        builtin_rules()
        fission_stage.preload_rules()
    finally:
        if previous is None:
            del os.environ["GRAPHSUB_CACHE_DIR"]
        else:
            os.environ["GRAPHSUB_CACHE_DIR"] = previous
