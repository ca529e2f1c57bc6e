import os

from hypothesis import HealthCheck, settings

# onnxruntime session start-up makes example timings noisy, so no per-example deadline; CI
# runs derandomized so a red build is always reproducible.
settings.register_profile("default", deadline=None, max_examples=60,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", parent=settings.get_profile("default"), derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")
