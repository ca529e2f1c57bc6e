"""Differential fuzzing of graphsub: random valid ONNX models (`models`), each run through
every graphsub path and compared with onnxruntime on the original (`differential`), and
failing models shrunk to a small reproducer (`minimize`). The campaign driver is
bench/fuzz.py; tests/fuzz/test_fuzz.py runs a CI-sized campaign."""
