"""A sampling profiler for every Python process of a run, vLLM's spawned engine cores included.

Put this folder first on PYTHONPATH and set RLGEN_STACK_SAMPLES=DIR: each Python process that starts then
writes DIR/stacks-PID.txt, one line per thread every RLGEN_STACK_PERIOD_S (0.25 s), with the time and the
innermost frames, for RLGEN_STACK_FOR_S seconds (600). Without RLGEN_STACK_SAMPLES it does nothing.
`benchmarks/stack_summary.py DIR` tallies the lines by window. Used to see where start-up time goes.
"""

import os

_DIR = os.environ.get("RLGEN_STACK_SAMPLES")
if _DIR:
    import sys
    import threading
    import time

    def _sample() -> None:
        period = float(os.environ.get("RLGEN_STACK_PERIOD_S", "0.25"))
        until = time.time() + float(os.environ.get("RLGEN_STACK_FOR_S", "600"))
        me = threading.get_ident()
        os.makedirs(_DIR, exist_ok=True)
        with open(os.path.join(_DIR, f"stacks-{os.getpid()}.txt"), "a", buffering=1) as f:
            f.write(f"# pid {os.getpid()} argv {' '.join(sys.argv[:4])[:200]}\n")
            while time.time() < until:
                time.sleep(period)
                names = {t.ident: t.name for t in threading.enumerate()}
                now = time.time()
                for ident, frame in sys._current_frames().items():
                    if ident == me:
                        continue
                    parts = []
                    while frame is not None and len(parts) < 10:
                        code = frame.f_code
                        parts.append(f"{code.co_name}@{os.path.basename(code.co_filename)}:{frame.f_lineno}")
                        frame = frame.f_back
                    f.write(f"{now:.2f} {names.get(ident, ident)} | {' < '.join(parts)}\n")

    threading.Thread(target=_sample, name="stack-sampler", daemon=True).start()
