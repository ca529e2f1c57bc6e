"""Peak memory of a command over time (`graphsub optimize` on a large model): RssAnon and
RssFile sampled every 0.2 s, every 25th sample printed beside the lines the command prints,
timestamped, and the peak resident set (wait4).

    python bench/memory_timeline.py .venv/bin/python -m graphsub.cli optimize MODEL.onnx \
        -o OUT.onnx --time-limit 200
"""
import os, subprocess, sys, threading, time
cmd = sys.argv[1:]
start = time.perf_counter()
proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        env={**os.environ, "COLUMNS": "150"})
samples = []
def sample():
    while proc.poll() is None:
        try:
            d = {l.split(":")[0]: int(l.split()[1]) for l in open(f"/proc/{proc.pid}/status")
                 if l.startswith(("RssAnon", "RssFile", "VmRSS"))}
            samples.append((time.perf_counter() - start, d))
        except Exception:
            pass
        time.sleep(0.2)
threading.Thread(target=sample, daemon=True).start()
lines = []
for raw in proc.stdout:
    lines.append((time.perf_counter() - start, raw.decode(errors="replace").rstrip()))
_, status, usage = os.wait4(proc.pid, 0)
print("exit", os.waitstatus_to_exitcode(status), "peak rss GB", usage.ru_maxrss / 1e6,
      "wall", round(time.perf_counter() - start, 1))
peak = max(samples, key=lambda s: s[1].get("VmRSS", 0))
print("sampled peak", peak)
# a coarse timeline: every 5 s the rss, and graphsub's lines
events = sorted([(t, "MEM", d) for t, d in samples[::25]] + [(t, "OUT", l) for t, l in lines],
                key=lambda e: e[0])
for t, kind, what in events:
    if kind == "MEM":
        print(f"{t:7.1f} rss {what.get('VmRSS',0)/1e6:5.2f} anon {what.get('RssAnon',0)/1e6:5.2f} file {what.get('RssFile',0)/1e6:5.2f}")
    elif what.strip():
        print(f"{t:7.1f} | {what[:160]}")
